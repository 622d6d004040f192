{{/*
The training pod, shared by every kind.
*/}}

{{- define "kubeddp.podMetadata" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
labels:
  {{- include "kubeddp.selectorLabels" . | trim | nindent 2 }}
  {{ $c.labelManagedBy }}: {{ .Values.managedBy }}
  {{ $c.labelComponent }}: {{ $c.trainerComponent }}
  {{- with .Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $annotations := dict }}
{{- if .Values.istio.optOut }}
{{- $_ := set $annotations $c.istioInjectAnnotation "false" }}
{{- end }}
{{- $annotations = merge $annotations (include "kubeddp.topologyAnnotations" . | fromYaml) .Values.podAnnotations }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* resources plus the GPU count and network.fabric's devices in requests and limits; a GPU pod also requests
requestsPerGpu x GPUs of the cpu and memory resources names neither as a request nor as a limit
(without requests a pod is BestEffort, the first evicted) */}}
{{- define "kubeddp.resources" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $resources := deepCopy .Values.resources }}
{{- if gt (int .Values.gpusPerNode) 0 }}
{{- $gpus := .Values.gpusPerNode | int }}
{{- range $section := list "requests" "limits" }}
{{- $_ := set $resources $section (merge (dict $c.gpuResource (toString $gpus)) (get $resources $section | default dict)) }}
{{- end }}
{{- range $name, $perGpu := .Values.requestsPerGpu }}
{{- $count := regexReplaceAll "[^0-9].*$" (toString ($perGpu | default "0")) "" | atoi }}
{{- if and (gt $count 0) (not (hasKey $resources.requests $name)) (not (hasKey $resources.limits $name)) }}
{{- $unit := regexReplaceAll "^[0-9]+" (toString $perGpu) "" }}
{{- $_ := set $resources.requests $name (printf "%d%s" (mul $count $gpus) $unit) }}
{{- end }}
{{- end }}
{{- end }}
{{- with (include "kubeddp.fabricResource" .) }}
{{- $device := dict . (include "kubeddp.fabricDevices" $) }}
{{- range $section := list "requests" "limits" }}
{{- $_ := set $resources $section (merge (deepCopy $device) (get $resources $section | default dict)) }}
{{- end }}
{{- end }}
{{- with $resources }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "kubeddp.volumes" -}}
- name: config
  configMap:
    name: {{ include "kubeddp.configMapName" . }}
- name: checkpoints
{{- if include "kubeddp.checkpointClaimMounted" . }}
  persistentVolumeClaim:
    claimName: {{ include "kubeddp.checkpointClaimName" . }}
{{- else if include "kubeddp.checkpointKeeper" . }}
  emptyDir:  # filled from the checkpoint keeper at start, synced back while training
    sizeLimit: {{ include "kubeddp.checkpointSizeLimit" . }}
{{- else if include "kubeddp.objectStore" . }}
  emptyDir: {}  # checkpoint.dir is in object storage: scratch space only
{{- else }}
  emptyDir: {}  # checkpoints.lostOnRetry: gone with the pod
{{- end }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize }}
- name: tmp
  emptyDir: {}
{{- if include "kubeddp.checkpointKeeper" . }}
{{ include "kubeddp.keeperTokenVolume" . }}
{{- end }}
{{- range .Values.volumes }}
- {{ omit . "mountPath" "readOnly" "subPath" | toYaml | nindent 2 | trim }}
{{- end }}
{{- end }}

{{- define "kubeddp.volumeMounts" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
- name: config
  mountPath: {{ $c.configDir }}
  readOnly: true
- name: checkpoints
  mountPath: {{ include "kubeddp.checkpointMountPath" . }}
- name: dshm
  mountPath: {{ $c.shmDir }}
- name: tmp
  mountPath: {{ $c.scratchDir }}
{{- if include "kubeddp.checkpointKeeper" . }}
{{ include "kubeddp.keeperTokenMount" . }}
{{- end }}
{{- range .Values.volumes }}
- name: {{ .name }}
  mountPath: {{ .mountPath | quote }}
  {{- if .readOnly }}
  readOnly: true
  {{- end }}
  {{- with .subPath }}
  subPath: {{ . | quote }}
  {{- end }}
{{- end }}
{{- end }}

{{/* the launch arguments: the built-in trainer reads the config after `--`; a user's own
program (trainer.script/module) ends launch's options, as with torchrun: everything after it
(after the `--` separator here) is the program's, and the config is launch's */}}
{{- define "kubeddp.args" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $t := .Values.trainer }}
{{- if or $t.script $t.module }}
- "--config"
- {{ $c.configFile }}
{{- if eq (toString $t.spawnsWorkers) "true" }}
- "--spawns-workers"
{{- else if eq (toString $t.spawnsWorkers) "false" }}
- "--no-spawns-workers"
{{- end }}
{{- if $t.script }}
- "--script"
- {{ $t.script | toJson }}
{{- else }}
- "--module"
- {{ $t.module | toJson }}
{{- end }}
- "--"
{{- range $t.args }}
- {{ . | toJson }}
{{- end }}
{{- else }}
- "--"
- "--config"
- {{ $c.configFile }}
{{- end }}
{{- end }}

{{/* the container's ports: the kind's rendezvous port (when kubeddp declares it), metrics */}}
{{- define "kubeddp.ports" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $k := index $c.kinds (include "kubeddp.kind" .) }}
{{- if $k.declaresPorts }}
- name: {{ $k.rendezvousPortName }}
  containerPort: {{ $k.rendezvousPort }}
  protocol: TCP
{{- end }}
- name: {{ $c.metricsPortName }}
  containerPort: {{ $c.metricsPort }}
  protocol: TCP
{{- end }}

{{/* env: the kind's own entries (.env, in the order .envOrder) where values.env may replace
a value in place, its downward-API entries (.fieldEnv: name -> fieldPath), then the rest of
values.env, the pod's and node's names (downwardEnv: diagnostics reports name them) unless set
already, then extraEnv */}}
{{- define "kubeddp.env" -}}
{{- $root := .root }}
{{- range $name := .envOrder }}
- name: {{ $name }}
  value: {{ get $root.Values.env $name | default (index $.env $name) | quote }}
{{- end }}
{{- range $name, $path := .fieldEnv }}
- name: {{ $name }}
  valueFrom:
    fieldRef:
      fieldPath: {{ $path | quote }}
{{- end }}
{{- range $name, $value := $root.Values.env }}
{{- if not (has $name $.envOrder) }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- include "kubeddp.storageEnv" $root }}
{{- $c := include "kubeddp.constants" $root | fromYaml }}
{{- if ne $root.Values.network.fabric $c.fabric.socket }}
- name: {{ $c.fabric.env }}
  value: {{ $root.Values.network.fabric | quote }}
{{- end }}
{{- range $name, $path := $c.downwardEnv }}
{{- if not (or (hasKey $root.Values.env $name) (include "kubeddp.inExtraEnv" (dict "list" $root.Values.extraEnv "name" $name)) (hasKey ($.fieldEnv | default dict) $name)) }}
- name: {{ $name }}
  valueFrom:
    fieldRef:
      fieldPath: {{ $path | quote }}
{{- end }}
{{- end }}
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* "true" when the extraEnv list (dict "list" L "name" N) has an entry named N */}}
{{- define "kubeddp.inExtraEnv" -}}
{{- range .list }}{{ if eq .name $.name }}true{{ end }}{{ end }}
{{- end }}

{{/* dict "root" $ "env" DICT "envOrder" LIST, optional "command" LIST (TrainJob: a runtime
sets its own) */}}
{{- define "kubeddp.container" -}}
{{- $root := .root -}}
{{- $c := include "kubeddp.constants" $root | fromYaml }}
{{- $k := index $c.kinds (include "kubeddp.kind" $root) }}
- name: {{ $k.container }}
  image: {{ include "kubeddp.image" $root }}
  imagePullPolicy: {{ include "kubeddp.pullPolicy" $root }}
  {{- with .command }}
  command:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  args:
    {{- include "kubeddp.args" $root | trim | nindent 4 }}
  {{- with (include "kubeddp.env" .) }}
  env:
    {{- . | trim | nindent 4 }}
  {{- end }}
  {{- with $root.Values.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    {{- include "kubeddp.ports" $root | trim | nindent 4 }}
  {{- with (include "kubeddp.resources" $root) }}
  resources:
    {{- . | trim | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "kubeddp.containerSecurityContext" $root | trim | nindent 4 }}
  volumeMounts:
    {{- include "kubeddp.volumeMounts" $root | trim | nindent 4 }}
  # launch writes its one-line reason to /dev/termination-log; a crash before that shows the
  # log's tail (`kubeddp status`, `kubectl describe pod`)
  terminationMessagePolicy: FallbackToLogsOnError
{{- end }}

{{/* podSecurityContext; on a mounted claim, fsGroupChangePolicy OnRootMismatch unless set:
the kubelet then skips the recursive chown of a large checkpoint volume at every pod start */}}
{{- define "kubeddp.podSecurityContext" -}}
{{- $context := deepCopy .Values.podSecurityContext }}
{{- if and (include "kubeddp.checkpointClaimMounted" .) (not (hasKey $context "fsGroupChangePolicy")) }}
{{- $_ := set $context "fsGroupChangePolicy" "OnRootMismatch" }}
{{- end }}
{{- toYaml $context }}
{{- end }}

{{/* Pod placement of the `helm test` pod; the training pods' affinity also places them
together (kubeddp.trainingAffinity): dict "root" $ "affinity" A */}}
{{- define "kubeddp.placement" -}}
{{- include "kubeddp.placementWith" (dict "root" . "affinity" .Values.affinity) }}
{{- end }}

{{- define "kubeddp.placementWith" -}}
{{- with .root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The pod of every kind: the PyTorchJob's replicas and the Indexed Job write it whole, a
TrainJob splits it (_trainjob.tpl). dict "root" $ "env" ... "envOrder" ... "restartPolicy" P
"subdomain" S "schedulerName" N "command" C */}}
{{- define "kubeddp.podTemplate" -}}
{{- $root := .root -}}
metadata:
  {{- include "kubeddp.podMetadata" $root | trim | nindent 2 }}
spec:
  {{- with .subdomain }}
  subdomain: {{ . }}
  {{- end }}
  {{- with (include "kubeddp.serviceAccountName" $root) }}
  serviceAccountName: {{ . }}
  automountServiceAccountToken: true
  {{- else }}
  automountServiceAccountToken: false
  {{- end }}
  {{- with .restartPolicy }}
  restartPolicy: {{ . }}
  {{- end }}
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
    {{- include "kubeddp.podSecurityContext" $root | trim | nindent 4 }}
  terminationGracePeriodSeconds: {{ include "kubeddp.terminationGrace" $root }}
  {{- with (include "kubeddp.placementWith" (dict "root" $root "affinity" (include "kubeddp.trainingAffinity" $root | fromYaml))) }}
  {{- . | trim | nindent 2 }}
  {{- end }}
  {{- if eq $root.Values.network.fabric "hostNetwork" }}
  hostNetwork: true
  dnsPolicy: {{ (include "kubeddp.constants" $root | fromYaml).fabric.hostNetworkDnsPolicy }}
  {{- end }}
  containers:
    {{- include "kubeddp.container" . | trim | nindent 4 }}
  volumes:
    {{- include "kubeddp.volumes" $root | trim | nindent 4 }}
{{- end }}
