{{/*
Names and labels. The job name is a DNS-1035 label: the operators derive pod and Service
names from it (<job>-master-0, <job>-node-0-0.<job>, <job>-0.<job>).
*/}}

{{- define "kubeddp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name; also the job name. */}}
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
