{{/*
Names, labels and object metadata. The job name is the full name: a DNS-1035 label, since the
operators derive pod and Service names from it (<job>-master-0, <job>-node-0-0.<job>, <job>-0.<job>).
managedBy=kubeddp (what `kubeddp render` sets) leaves out what only Helm uses.
*/}}

{{- define "kubeddp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubeddp.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kubeddp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "true" when Helm applies the objects (not `kubeddp render`) */}}
{{- define "kubeddp.helmManaged" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if ne .Values.managedBy $c.kubeddpManaged }}true{{ end }}
{{- end }}

{{- define "kubeddp.selectorLabels" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{ $c.labelName }}: {{ include "kubeddp.name" . }}
{{ $c.labelInstance }}: {{ .Release.Name }}
{{- end }}

{{- define "kubeddp.labels" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $helm := include "kubeddp.helmManaged" . }}
{{- if $helm }}
helm.sh/chart: {{ include "kubeddp.chart" . }}
{{- end }}
{{ include "kubeddp.selectorLabels" . | trim }}
{{- if $helm }}
app.kubernetes.io/version: {{ default .Chart.AppVersion .Values.image.tag | trunc 63 | trimSuffix "-" | quote }}
{{- end }}
{{ $c.labelManagedBy }}: {{ .Values.managedBy }}
{{- end }}

{{/* labels plus the component; call with (list $ "component") */}}
{{- define "kubeddp.componentLabels" -}}
{{- $c := include "kubeddp.constants" (index . 0) | fromYaml }}
{{ include "kubeddp.labels" (index . 0) | trim }}
{{ $c.labelComponent }}: {{ index . 1 }}
{{- end }}

{{/*
An object's metadata: dict "root" $ "name" NAME "component" C, optional "labels" (a list of
maps, written in order) and "annotations" (a map).
*/}}
{{- define "kubeddp.metadata" -}}
name: {{ .name }}
{{- with .root.Values.namespaceOverride }}
namespace: {{ . }}
{{- end }}
labels:
  {{- include "kubeddp.componentLabels" (list .root .component) | trim | nindent 2 }}
  {{- range .labels }}
  {{- with . }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- end }}
{{- with .annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The job object's metadata: the Kueue queue label when asked */}}
{{- define "kubeddp.jobMetadata" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $queue := dict }}
{{- with .Values.kueue.queueName }}
{{- $queue = dict $c.kueueQueueLabel . }}
{{- end }}
{{- $storage := dict $c.checkpointsAnnotation (include "kubeddp.storageLine" .) }}
{{- with (include "kubeddp.networkLine" .) }}
{{- $_ := set $storage $c.networkAnnotation . }}
{{- end }}
{{- include "kubeddp.metadata" (dict "root" . "name" (include "kubeddp.fullname" .) "component" "job" "labels" (list $queue) "annotations" $storage) }}
{{- end }}

{{- define "kubeddp.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "kubeddp.configMapName" -}}
{{- printf "%s-config" (include "kubeddp.fullname" .) }}
{{- end }}

{{- define "kubeddp.checkpointClaimName" -}}
{{- default (printf "%s-checkpoints" (include "kubeddp.fullname" .)) .Values.checkpoints.existingClaim }}
{{- end }}

{{- define "kubeddp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubeddp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Resolved knobs: null values take the documented defaults. */}}
{{- define "kubeddp.nodes" -}}
{{- if not (kindIs "invalid" .Values.nodes) }}
{{- .Values.nodes | int }}
{{- else if .Values.elastic.enabled }}
{{- .Values.elastic.maxNodes | int }}
{{- else }}1{{ end }}
{{- end }}

{{- define "kubeddp.nproc" -}}
{{- if not (kindIs "invalid" .Values.nprocPerNode) }}
{{- toString .Values.nprocPerNode }}
{{- else if gt (int .Values.gpusPerNode) 0 }}
{{- .Values.gpusPerNode | int }}
{{- else }}auto{{ end }}
{{- end }}

{{/* the process count the job means: nprocPerNode when a count, else the GPUs per node, else
the CPU default (env KUBEDDP_CPU_NPROC, else 1) */}}
{{- define "kubeddp.nprocCount" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $nproc := include "kubeddp.nproc" . }}
{{- $cpu := toString (get .Values.env $c.cpuNprocEnv | default "") }}
{{- if regexMatch "^[0-9]+$" $nproc }}{{ $nproc }}
{{- else if regexMatch "^[1-9][0-9]*$" $cpu }}{{ $cpu }}
{{- else }}1{{ end }}
{{- end }}

{{- define "kubeddp.pullPolicy" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- default $c.defaultImagePullPolicy .Values.image.pullPolicy }}
{{- end }}

{{/* "true" when the training pods mount the checkpoint claim (templates/_storage.tpl) */}}
{{- define "kubeddp.checkpointClaimMounted" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if eq (include "kubeddp.checkpointStorage" .) $c.storage.mount }}true{{ end }}
{{- end }}

{{- define "kubeddp.restartPolicy" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- default $c.defaultRestartPolicy .Values.restartPolicy }}
{{- end }}

{{- define "kubeddp.backoffLimit" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if kindIs "invalid" .Values.backoffLimit }}{{ $c.defaultBackoffLimit }}{{ else }}{{ .Values.backoffLimit | int }}{{ end }}
{{- end }}

{{/* timeLimit in whole seconds (each kind's activeDeadlineSeconds); empty when unset. A
duration is hours, minutes and seconds in that order (90m, 12h, 1h30m); digits alone are
seconds. */}}
{{- define "kubeddp.timeLimitSeconds" -}}
{{- $limit := .Values.timeLimit }}
{{- if not (kindIs "invalid" $limit) }}
{{- $seconds := 0 }}
{{- if kindIs "string" $limit }}
{{- if regexMatch "^[0-9]+$" $limit }}
{{- $seconds = atoi $limit }}
{{- else }}
{{- $units := dict "h" 3600 "m" 60 "s" 1 }}
{{- range $part := regexFindAll "[0-9]+[hms]" $limit -1 }}
{{- $unit := regexFind "[hms]$" $part }}
{{- $seconds = add $seconds (mul (atoi (trimSuffix $unit $part)) (get $units $unit)) }}
{{- end }}
{{- end }}
{{- else }}
{{- $seconds = int64 $limit }}
{{- end }}
{{- if lt (int64 $seconds) 1 }}
{{- fail (printf "`timeLimit` %v is under one second: give a duration such as 90m or 12h, or leave it unset for no limit" $limit) }}
{{- end }}
{{- int64 $seconds }}
{{- end }}
{{- end }}
