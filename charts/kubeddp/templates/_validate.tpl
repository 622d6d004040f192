{{/*
Rules that span several values; values.schema.json checks each value on its own. `kubeddp
render` runs the same rules (it renders this chart): every message names the values in
backticks, which render turns into its options, and says how to fix it.
*/}}
{{- define "kubeddp.validate" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $kind := include "kubeddp.kind" . }}
{{- $k := index $c.kinds $kind }}
{{- $v := .Values }}
{{- $shownKind := ternary (printf "%s (picked by kind auto: set `kind` to choose)" $kind) $kind (eq $v.kind $c.autoKind) }}
{{- $job := include "kubeddp.fullname" . }}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- $nproc := include "kubeddp.nproc" . }}
{{- $isCount := regexMatch "^[0-9]+$" $nproc }}
{{- if or (not (regexMatch $c.jobNamePattern $job)) (gt (len $job) (int $c.maxJobNameLength)) }}
{{- fail (printf "job name %q (the release's full name, or `fullnameOverride`) is not a DNS-1035 label of at most %d characters: use lower-case letters, digits and '-', starting with a letter" $job (int $c.maxJobNameLength)) }}
{{- end }}
{{- range $path, $why := $k.unsupported }}
{{- $value := $v }}
{{- range splitList "." $path }}
{{- $value = get $value . }}
{{- end }}
{{- $emptyCollection := and (or (kindIs "slice" $value) (kindIs "map" $value)) (empty $value) }}
{{- if not (or (kindIs "invalid" $value) (eq (toString $value) "false") (eq (toString $value) "") $emptyCollection) }}
{{- $shown := ternary (toJson $value) (toString $value) (or (kindIs "slice" $value) (kindIs "map" $value)) }}
{{- fail (printf "`%s` (%s) cannot be set for kind %s: %s" $path $shown $shownKind $why) }}
{{- end }}
{{- end }}
{{- if and (eq $kind "TrainJob") (not $v.trainJob.ownRuntime) (not (kindIs "invalid" $v.backoffLimit)) }}
{{- fail "`backoffLimit` cannot be set for kind TrainJob with `trainJob.ownRuntime` false: Trainer v2.3 runtimePatches have no such field; keep ownRuntime, or set it in your runtime" }}
{{- end }}
{{- if and (not (kindIs "invalid" $v.restartPolicy)) (not (has $v.restartPolicy $k.restartPolicies)) }}
{{- fail (printf "`restartPolicy` %s is not valid for kind %s: use one of %s" $v.restartPolicy $shownKind (join ", " $k.restartPolicies)) }}
{{- end }}
{{- if not (or $isCount (has $nproc $k.nprocWords)) }}
{{- fail (printf "`nprocPerNode` %q is not valid for kind %s: use a count, or one of %s" $nproc $shownKind (join ", " $k.nprocWords)) }}
{{- end }}
{{- if and (gt (int $v.gpusPerNode) 0) $isCount (gt (atoi $nproc) (int $v.gpusPerNode)) }}
{{- fail (printf "`nprocPerNode` is %s but `gpusPerNode` is %d: use at most one process per GPU" $nproc (int $v.gpusPerNode)) }}
{{- end }}
{{- if $v.elastic.enabled }}
{{- if gt (int $v.elastic.minNodes) (int $v.elastic.maxNodes) }}
{{- fail (printf "`elastic.minNodes` (%d) is greater than `elastic.maxNodes` (%d): make MIN <= MAX" (int $v.elastic.minNodes) (int $v.elastic.maxNodes)) }}
{{- end }}
{{- if or (lt $nodes (int $v.elastic.minNodes)) (gt $nodes (int $v.elastic.maxNodes)) }}
{{- fail (printf "`nodes` (%d) is outside `elastic.minNodes`..`elastic.maxNodes` (%d..%d): pick a count in between, or leave it unset" $nodes (int $v.elastic.minNodes) (int $v.elastic.maxNodes)) }}
{{- end }}
{{- end }}
{{- if and $v.pytorchJob.masterReplica $v.elastic.enabled }}
{{- fail "`pytorchJob.masterReplica` and `elastic.enabled` are both set: an elastic PyTorchJob has Workers only; drop one" }}
{{- end }}
{{- $newClaim := dict "size" $v.checkpoints.size "storageClassName" $v.checkpoints.storageClassName "accessMode" $v.checkpoints.accessMode }}
{{- range $key, $value := $newClaim }}
{{- if and $value $v.checkpoints.existingClaim }}
{{- fail (printf "`checkpoints.existingClaim` (%s) and `checkpoints.%s` (%s) are both set: the %s is for the claim kubeddp creates; mount an existing claim or create one, not both" $v.checkpoints.existingClaim $key $value $key) }}
{{- end }}
{{- if and $value $v.checkpoints.lostOnRetry }}
{{- fail (printf "`checkpoints.lostOnRetry` and `checkpoints.%s` (%s) are both set: lostOnRetry puts the checkpoints on an emptyDir, no claim; drop one" $key $value) }}
{{- end }}
{{- end }}
{{- if and $v.checkpoints.existingClaim $v.checkpoints.lostOnRetry }}
{{- fail (printf "`checkpoints.existingClaim` (%s) and `checkpoints.lostOnRetry` are both set: mount the claim or an emptyDir, not both" $v.checkpoints.existingClaim) }}
{{- end }}
{{- include "kubeddp.validateProgram" . }}
{{- include "kubeddp.validateCheckpoints" . }}
{{- include "kubeddp.validateVolumes" . }}
{{- include "kubeddp.validateEnv" . }}
{{- include "kubeddp.validateNetwork" . }}
{{- range $name, $settings := $v.monitoring }}
{{- if not $settings.enabled }}
{{- range $key := list "labels" "interval" }}
{{- if get $settings $key }}
{{- fail (printf "`monitoring.%s.%s` is set but `monitoring.%s.enabled` is false: enable it, or leave it out" $name $key $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* trainer.script/module: one program; its args; the config keys that still apply */}}
{{- define "kubeddp.validateProgram" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $t := .Values.trainer }}
{{- if and $t.script $t.module }}
{{- fail (printf "`trainer.script` (%s) and `trainer.module` (%s) are both set: run one program" $t.script $t.module) }}
{{- end }}
{{- $program := or $t.script $t.module }}
{{- if and $t.args (not $program) }}
{{- fail "`trainer.args` is set but neither `trainer.script` nor `trainer.module`: the arguments are your program's; name it" }}
{{- end }}
{{- if and (eq (toString $t.spawnsWorkers) "true") (not $program) }}
{{- fail "`trainer.spawnsWorkers` is true but neither `trainer.script` nor `trainer.module` is set: it describes your program; name it" }}
{{- end }}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- if and (eq (toString $t.spawnsWorkers) "true") (or (gt $nodes 1) .Values.elastic.enabled) }}
{{- fail (printf "`trainer.spawnsWorkers` is true: your program starts its own workers, so each of the %d nodes would train its own copy; set nodes to 1, or convert it to torchrun style (docs/your-own-script.md)" $nodes) }}
{{- end }}
{{- if $program }}
{{- range $section, $keys := .Values.config }}
{{- range $key, $_ := $keys }}
{{- $path := printf "%s.%s" $section $key }}
{{- if not (or (has $section $c.programConfigKeys) (has $path $c.programConfigKeys)) }}
{{- fail (printf "`config.%s` is set but `trainer.%s` runs your own program, which that key does not configure: pass your program's options in trainer.args (with a program only %s apply)" $path (ternary "script" "module" (not (empty $t.script))) (join " and " $c.programConfigKeys)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* volumes: one source each; names and mount paths used once */}}
{{- define "kubeddp.validateVolumes" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $names := list }}
{{- $paths := list }}
{{- range .Values.volumes }}
{{- $sources := list }}
{{- $entry := . }}
{{- range $source := $c.volumeSources }}
{{- if hasKey $entry $source }}
{{- $sources = append $sources $source }}
{{- end }}
{{- end }}
{{- if eq (len $sources) 0 }}
{{- fail (printf "`volumes` entry %s has no source: give one of %s" $entry.name (join ", " $c.volumeSources)) }}
{{- else if gt (len $sources) 1 }}
{{- fail (printf "`volumes` entry %s has %d sources (%s): give exactly one" $entry.name (len $sources) (join ", " $sources)) }}
{{- end }}
{{- if has $entry.name $names }}
{{- fail (printf "`volumes` has two entries named %s: give each its own name" $entry.name) }}
{{- end }}
{{- if has $entry.mountPath $paths }}
{{- fail (printf "`volumes` mounts two volumes at %s: give each its own mountPath" $entry.mountPath) }}
{{- end }}
{{- $names = append $names $entry.name }}
{{- $paths = append $paths $entry.mountPath }}
{{- end }}
{{- end }}

{{/* each env name once: an entry of `extraEnv` that `env` or another entry also sets would
silently replace it (the schema refuses the names kubeddp, torchrun and the operator set) */}}
{{- define "kubeddp.validateEnv" -}}
{{- $env := default dict .Values.env }}
{{- $seen := dict }}
{{- range $entry := .Values.extraEnv }}
{{- $name := toString $entry.name }}
{{- if hasKey $env $name }}
{{- fail (printf "`extraEnv` entry %s is also set in `env`: give each variable once" $name) }}
{{- end }}
{{- if hasKey $seen $name }}
{{- fail (printf "`extraEnv` has %s twice: give each variable once" $name) }}
{{- end }}
{{- $_ := set $seen $name true }}
{{- end }}
{{- end }}
