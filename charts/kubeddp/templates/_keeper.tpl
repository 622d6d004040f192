{{/*
The checkpoint keeper's sizes and secret. The training pods' grace period and emptyDir are
computed here, and only here, from the constants of trainer/keeper/sizing.py ($c.keeperSizing,
which launch reads too), so they follow checkpoints.size the way launch plans its last send;
the keeper's resources are that module's, as a constant. tests/unit/test_keeper_manifests.py
checks what they render against what launch plans.
*/}}

{{/* bytes of a Kubernetes quantity (the schema has checked its form), as a float */}}
{{- define "kubeddp.quantityBytes" -}}
{{- $c := include "kubeddp.constants" .root | fromYaml }}
{{- $text := toString .quantity | trimPrefix "+" }}
{{- $number := regexFind "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" $text }}
{{- $suffix := trimPrefix $number $text }}
{{- $factor := 1.0 }}
{{- if hasKey $c.quantityFactors $suffix }}
{{- $factor = get $c.quantityFactors $suffix | float64 }}
{{- else }}{{/* an exponent: e9, E-3 */}}
{{- $exponent := substr 1 -1 $suffix | int }}
{{- range until (int (max $exponent (sub 0 $exponent))) }}
{{- $factor = ternary (mulf $factor 10.0) (divf $factor 10.0) (gt $exponent 0) }}
{{- end }}
{{- end }}
{{- mulf (float64 $number) $factor }}
{{- end }}

{{/* checkpoint.keep and checkpoint.preempt_grace_seconds of the trainer config, or their
defaults */}}
{{- define "kubeddp.checkpointSetting" -}}
{{- $c := include "kubeddp.constants" .root | fromYaml }}
{{- $checkpoint := get (.root.Values.config | default dict) "checkpoint" | default dict }}
{{- $default := ternary $c.defaultKeep $c.defaultPreemptGrace (eq .name "keep") }}
{{- if hasKey $checkpoint .name }}{{ get $checkpoint .name }}{{ else }}{{ $default }}{{ end }}
{{- end }}

{{/* the largest checkpoint the claim holds: checkpoints.size / (keep + 1), keep committed and
one more being received (the keeper prunes after it commits) */}}
{{- define "kubeddp.checkpointBytes" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $size := .Values.checkpoints.size | default $c.defaultCheckpointSize }}
{{- $claim := include "kubeddp.quantityBytes" (dict "root" . "quantity" $size) | float64 }}
{{- $keep := include "kubeddp.checkpointSetting" (dict "root" . "name" "keep") | float64 }}
{{- divf (maxf 0.0 $claim) (addf $keep 1.0) }}
{{- end }}

{{/* the training pods' terminationGracePeriodSeconds: the value when set; behind a keeper the
save after SIGTERM (preempt grace), torchrun's margin, the send of the largest checkpoint at the
floor rate and the margin before SIGKILL, in whole seconds; else the default */}}
{{- define "kubeddp.terminationGrace" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $k := $c.keeperSizing }}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}
{{- .Values.terminationGracePeriodSeconds | int }}
{{- else if include "kubeddp.checkpointKeeper" . }}
{{- $grace := include "kubeddp.checkpointSetting" (dict "root" . "name" "preempt_grace_seconds") | float64 }}
{{- $bytes := include "kubeddp.checkpointBytes" . | float64 }}
{{- $send := addf $k.sendSlackSeconds (divf $bytes $k.floorBytesPerSecond) }}
{{- $total := addf (addf $grace $k.shutdownMarginSeconds) $send }}
{{- addf $total $k.killMarginSeconds | ceil | int }}
{{- else }}{{ $c.terminationGraceSeconds }}{{ end }}
{{- end }}

{{/* the training pods' checkpoint.dir behind a keeper: the newest fetched, `keep` written and
one being written (the writer prunes after its rename), plus a script's own files, in MiB */}}
{{- define "kubeddp.checkpointSizeLimit" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $keep := include "kubeddp.checkpointSetting" (dict "root" . "name" "keep") | float64 }}
{{- $bytes := include "kubeddp.checkpointBytes" . | float64 }}
{{- $total := addf (mulf (addf $keep 2.0) $bytes) $c.keeperSizing.scriptFilesBytes }}
{{- printf "%dMi" (divf $total 1048576 | ceil | int) }}
{{- end }}

{{/* the Secret that holds the job's keeper secret: a user's, or <job>-keeper-token */}}
{{- define "kubeddp.keeperTokenSecret" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- default (printf "%s%s" (include "kubeddp.fullname" .) $c.keeperTokenSuffix) .Values.keeper.existingSecret }}
{{- end }}

{{/* the secret's volume and its mount, in the keeper's pod and every training pod */}}
{{- define "kubeddp.keeperTokenVolume" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
- name: {{ $c.keeperTokenVolume }}
  secret:
    secretName: {{ include "kubeddp.keeperTokenSecret" . }}
    items:
      - key: {{ $c.keeperTokenKey }}
        path: {{ $c.keeperTokenKey }}
{{- end }}

{{- define "kubeddp.keeperTokenMount" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
- name: {{ $c.keeperTokenVolume }}
  mountPath: {{ $c.keeperTokenDir }}
  readOnly: true
{{- end }}

{{- define "kubeddp.keeperTokenFile" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- printf "%s/%s" $c.keeperTokenDir $c.keeperTokenKey }}
{{- end }}

{{/* the keeper pod's placement and priority: each keeper.* value, else the training pods'
(null: a default's null reaches the template as a key under the helm binary, not the library) */}}
{{- define "kubeddp.keeperPlacement" -}}
{{- $k := .Values.keeper }}
{{- with ternary $k.priorityClassName .Values.priorityClassName (not (kindIs "invalid" $k.priorityClassName)) }}
priorityClassName: {{ . }}
{{- end }}
{{- with ternary $k.nodeSelector .Values.nodeSelector (not (kindIs "invalid" $k.nodeSelector)) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ternary $k.tolerations .Values.tolerations (not (kindIs "invalid" $k.tolerations)) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ternary $k.affinity .Values.affinity (not (kindIs "invalid" $k.affinity)) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* the keeper container's requests and limits: keeper.resources, else sizing.py's */}}
{{- define "kubeddp.keeperResources" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- toYaml (ternary .Values.keeper.resources $c.keeperSizing.keeperResources (not (kindIs "invalid" .Values.keeper.resources))) }}
{{- end }}
