{{/*
The in-memory snapshots of the training state (trainer/worker/snapshot/): each pod keeps two
in its memory-backed /dev/shm, so the volume and the pod's memory request grow by twice
memorySnapshots.size.
*/}}

{{/* bytes the pod's two snapshots take: twice memorySnapshots.size, or unset twice one
snapshot of the built-in trainer's state as its config describes it (kubeddp.stateBytes); a
given size that cannot hold that state is refused in one line */}}
{{- define "kubeddp.snapshotBytes" -}}
{{- $size := .Values.memorySnapshots.size }}
{{- $state := include "kubeddp.stateBytes" . | float64 }}
{{- if kindIs "invalid" $size }}
{{- mulf 2.0 $state }}
{{- else }}
{{- $given := include "kubeddp.quantityBytes" (dict "root" . "quantity" $size) | float64 }}
{{- if and (gt $given 0.0) (lt $given $state) }}
{{- fail (printf "`memorySnapshots.size` %s cannot hold one snapshot of the training state its config describes (%dMi: the model, the optimizer's state and the rest): give at least that, leave it unset to have it computed, or 0 to reserve nothing" (toString $size) (divf $state 1048576.0 | ceil | int)) }}
{{- end }}
{{- mulf 2.0 $given }}
{{- end }}
{{- end }}

{{/* one snapshot of the built-in trainer's state (trainer/state_size.py's table, in
$c.snapshotSizing); 0 for a program of the user's own, a custom workload, or config
checkpoint.memory_snapshots false */}}
{{- define "kubeddp.stateBytes" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $s := $c.snapshotSizing }}
{{- $config := .Values.config | default dict }}
{{- $checkpoint := get $config "checkpoint" | default dict }}
{{- $train := get $config "train" | default dict }}
{{- $workload := merge (deepCopy (get $config "workload" | default dict)) $s.workloadDefaults }}
{{- $terms := get $s.terms (toString $workload.name) }}
{{- if or .Values.trainer.script .Values.trainer.module (eq (toString (get $checkpoint "memory_snapshots")) "false") (not $terms) }}0
{{- else }}
{{- $state := include "kubeddp.sumOfTerms" (dict "terms" $terms.state "settings" $workload) | float64 }}
{{- $params := include "kubeddp.sumOfTerms" (dict "terms" $terms.params "settings" $workload) | float64 }}
{{- $moments := get $s.moments (toString (get $train "optimizer" | default $s.defaultOptimizer)) | float64 }}
{{- addf (mulf (addf $state (mulf $moments $params)) $s.floatBytes) $s.overheadBytes }}
{{- end }}
{{- end }}

{{/* trainer/state_size.py _evaluate: the sum over `terms` of coefficient x settings named */}}
{{- define "kubeddp.sumOfTerms" -}}
{{- $total := 0.0 }}
{{- range $term := .terms }}
{{- $product := index $term 0 | float64 }}
{{- range $name := index $term 1 }}
{{- $product = mulf $product (get $.settings $name | float64) }}
{{- end }}
{{- $total = addf $total $product }}
{{- end }}
{{- $total }}
{{- end }}

{{/* /dev/shm's sizeLimit: shmSize, plus the snapshots */}}
{{- define "kubeddp.shmSizeLimit" -}}
{{- $snapshots := include "kubeddp.snapshotBytes" . | float64 }}
{{- if gt $snapshots 0.0 }}
{{- $shm := include "kubeddp.quantityBytes" (dict "root" . "quantity" .Values.shmSize) | float64 }}
{{- printf "%dMi" (divf (addf $shm $snapshots) 1048576.0 | ceil | int) }}
{{- else }}{{ .Values.shmSize }}{{ end }}
{{- end }}

{{/* the snapshots added to the container's memory limit where one is set, and to its request
where one is set or no limit is (a limit alone is the request too): kubeddp's memory comes on
top of the container's own, whose QoS class stays. `resources`: its requests and limits so far */}}
{{- define "kubeddp.snapshotMemory" -}}
{{- $root := .root }}
{{- $resources := .resources }}
{{- $snapshots := include "kubeddp.snapshotBytes" $root | float64 }}
{{- $limited := get (get $resources "limits" | default dict) "memory" }}
{{- range $section := list "requests" "limits" }}
{{- $amounts := get $resources $section | default dict }}
{{- $memory := get $amounts "memory" }}
{{- if and (gt $snapshots 0.0) (or $memory (and (eq $section "requests") (not $limited))) }}
{{- $base := 0.0 }}
{{- with $memory }}{{ $base = include "kubeddp.quantityBytes" (dict "root" $root "quantity" .) | float64 }}{{ end }}
{{- $_ := set $amounts "memory" (printf "%dMi" (divf (addf $base $snapshots) 1048576.0 | ceil | int)) }}
{{- $_ := set $resources $section $amounts }}
{{- end }}
{{- end }}
{{- end }}

{{/* where the workers keep them: the pod's own /dev/shm, one directory whatever its node rank */}}
{{- define "kubeddp.snapshotEnv" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
- name: {{ $c.snapshotDirEnv }}
  value: {{ $c.podSnapshotDir | quote }}
{{- end }}
