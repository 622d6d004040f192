{{/*
The training pod, shared by every kind. Call with
  dict "root" $ "container" NAME "ports" LIST "env" LIST
*/}}

{{- define "kubeddp.podAnnotations" -}}
{{- $annotations := dict }}
{{- if .Values.istio.optOut }}
{{- $_ := set $annotations "sidecar.istio.io/inject" "false" }}
{{- end }}
{{- $annotations = merge $annotations .Values.podAnnotations }}
{{- with $annotations }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "kubeddp.podLabels" -}}
{{ include "kubeddp.selectorLabels" . }}
app.kubernetes.io/component: trainer
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Container resources: resources + the GPU request, limits carry the GPU count. */}}
{{- define "kubeddp.resources" -}}
{{- $resources := deepCopy .Values.resources }}
{{- if gt (int .Values.gpusPerNode) 0 }}
{{- $limits := default dict $resources.limits }}
{{- $_ := set $limits .Values.gpuResource (int .Values.gpusPerNode) }}
{{- $_ := set $resources "limits" $limits }}
{{- end }}
{{- toYaml $resources }}
{{- end }}

{{- define "kubeddp.volumes" -}}
- name: config
  configMap:
    name: {{ include "kubeddp.configMapName" . }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize }}
- name: tmp
  emptyDir: {}
- name: checkpoints
{{- if .Values.checkpoints.persistence }}
  persistentVolumeClaim:
    claimName: {{ include "kubeddp.checkpointClaimName" . }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}

{{- define "kubeddp.volumeMounts" -}}
- name: config
  mountPath: /etc/kubeddp
  readOnly: true
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
- name: checkpoints
  mountPath: /checkpoints
{{- end }}

{{/* Env every kind gets: the CPU worker count, then the user's env. */}}
{{- define "kubeddp.baseEnv" -}}
- name: KUBEDDP_CPU_NPROC
  value: {{ .Values.cpuWorkersPerNode | quote }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kubeddp.container" -}}
{{- $root := .root -}}
- name: {{ .container }}
  image: {{ include "kubeddp.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args:
    - "--"
    - "--config"
    - /etc/kubeddp/config.yaml
  {{- $ports := .ports }}
  {{- if $root.Values.metrics.enabled }}
  {{- $ports = append $ports (dict "name" "metrics" "containerPort" (int $root.Values.metrics.port)) }}
  {{- end }}
  {{- with $ports }}
  ports:
    {{- range . }}
    - name: {{ .name }}
      containerPort: {{ .containerPort }}
      protocol: TCP
    {{- end }}
  {{- end }}
  env:
    {{- with .env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- include "kubeddp.baseEnv" $root | nindent 4 }}
  resources:
    {{- include "kubeddp.resources" $root | nindent 4 }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  volumeMounts:
    {{- include "kubeddp.volumeMounts" $root | nindent 4 }}
{{- end }}

{{/* The pod template; .restartPolicy is the pod's own policy (empty for PyTorchJob). */}}
{{- define "kubeddp.podTemplate" -}}
{{- $root := .root -}}
metadata:
  labels:
    {{- include "kubeddp.podLabels" $root | nindent 4 }}
  {{- with (include "kubeddp.podAnnotations" $root) }}
  annotations:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  {{- with .restartPolicy }}
  restartPolicy: {{ . }}
  {{- end }}
  {{- with .subdomain }}
  subdomain: {{ . }}
  {{- end }}
  {{- with (include "kubeddp.serviceAccountName" $root) }}
  serviceAccountName: {{ . }}
  {{- end }}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
  {{- with $root.Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .schedulerName }}
  schedulerName: {{ . }}
  {{- end }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  {{- with $root.Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    {{- include "kubeddp.container" . | nindent 4 }}
  volumes:
    {{- include "kubeddp.volumes" $root | nindent 4 }}
{{- end }}
