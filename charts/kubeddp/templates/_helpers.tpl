{{/*
Names and labels. The job name is the full name: a DNS-1035 label, since the operators derive
pod and Service names from it (<job>-master-0, <job>-node-0-0.<job>, <job>-0.<job>).
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

{{- define "kubeddp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubeddp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kubeddp.labels" -}}
helm.sh/chart: {{ include "kubeddp.chart" . }}
{{ include "kubeddp.selectorLabels" . }}
app.kubernetes.io/version: {{ default .Chart.AppVersion .Values.image.tag | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* labels plus app.kubernetes.io/component; call with (list $ "component") */}}
{{- define "kubeddp.componentLabels" -}}
{{ include "kubeddp.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "kubeddp.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
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

{{/* Resolved knobs: null values take the same defaults as `kubeddp render`. */}}
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

{{- define "kubeddp.restartPolicy" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- default $c.defaultRestartPolicy .Values.restartPolicy }}
{{- end }}

{{- define "kubeddp.backoffLimit" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if kindIs "invalid" .Values.backoffLimit }}{{ $c.defaultBackoffLimit }}{{ else }}{{ .Values.backoffLimit | int }}{{ end }}
{{- end }}
