{{/*
Where the checkpoints live. One of:
  keeper   one keeper pod mounts the claim (ReadWriteOnce is enough); training pods keep
           checkpoint.dir on an emptyDir that launch fills from it and syncs back
  mount    every training pod mounts the claim at checkpoint.dir (several pods: ReadWriteMany)
  emptyDir checkpoints.lostOnRetry: lost with the pod
  s3       checkpoint.dir is s3://bucket/prefix: object storage, no claim
*/}}
{{- define "kubeddp.checkpointStorage" -}}
{{- $v := .Values.checkpoints }}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- if hasPrefix "s3://" (include "kubeddp.checkpointDir" .) }}s3
{{- else if $v.lostOnRetry }}emptyDir
{{- else if $v.storage }}{{ $v.storage }}
{{- else if and (gt $nodes 1) (ne (toString $v.accessMode) "ReadWriteMany") }}keeper
{{- else }}mount{{ end }}
{{- end }}

{{/* checkpoint.dir as the pods see it: the checkpoints volume is mounted exactly there */}}
{{- define "kubeddp.checkpointDir" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $checkpoint := get (.Values.config | default dict) "checkpoint" | default dict }}
{{- get $checkpoint "dir" | default $c.checkpointDir }}
{{- end }}

{{/* where the checkpoints volume is mounted: checkpoint.dir, or scratch space for s3:// */}}
{{- define "kubeddp.checkpointMountPath" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- ternary $c.checkpointDir (include "kubeddp.checkpointDir" .) (eq (include "kubeddp.checkpointStorage" .) "s3") }}
{{- end }}

{{- define "kubeddp.keeperName" -}}
{{- printf "%s-keeper" (include "kubeddp.fullname" .) }}
{{- end }}

{{/* the access mode of the claim kubeddp creates */}}
{{- define "kubeddp.checkpointAccessMode" -}}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- $shared := and (eq (include "kubeddp.checkpointStorage" .) "mount") (gt $nodes 1) }}
{{- default (ternary "ReadWriteMany" "ReadWriteOnce" $shared) .Values.checkpoints.accessMode }}
{{- end }}

{{/* env of the training container for the storage: the keeper's address; a user's program
starts in checkpoint.dir (a relative snapshot.pt lands on the kept storage) */}}
{{- define "kubeddp.storageEnv" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if eq (include "kubeddp.checkpointStorage" .) "keeper" }}
- name: {{ $c.keeperEnv }}
  value: {{ printf "http://%s:%d" (include "kubeddp.keeperName" .) (int $c.keeperPort) | quote }}
{{- end }}
{{- if or .Values.trainer.script .Values.trainer.module }}
- name: {{ $c.programInCheckpointDirEnv }}
  value: "1"
{{- end }}
{{- end }}

{{/* One line: the storage this job uses and what the cluster must offer (NOTES, render) */}}
{{- define "kubeddp.storageLine" -}}
{{- $storage := include "kubeddp.checkpointStorage" . }}
{{- $dir := include "kubeddp.checkpointDir" . }}
{{- $claim := include "kubeddp.checkpointClaimName" . }}
{{- $class := ternary "an existing claim" (printf "StorageClass %s" (default "(the cluster's default)" .Values.checkpoints.storageClassName)) (not (empty .Values.checkpoints.existingClaim)) }}
{{- $mode := ternary "its own access mode" (include "kubeddp.checkpointAccessMode" .) (not (empty .Values.checkpoints.existingClaim)) }}
{{- if eq $storage "keeper" }}
{{- printf "Checkpoints: claim %s (%s, %s) mounted only by the keeper pod %s; every training pod keeps %s on an emptyDir filled from it and synced back. The cluster must offer: any StorageClass (ReadWriteOnce is enough)." $claim $mode $class (include "kubeddp.keeperName" .) $dir }}
{{- else if eq $storage "mount" }}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- printf "Checkpoints: claim %s (%s, %s) mounted at %s in every pod. The cluster must offer: %s." $claim $mode $class $dir (ternary "ReadWriteMany storage (EFS, Filestore, Azure Files, NFS...): the pods run on several nodes" "any StorageClass" (gt $nodes 1)) }}
{{- else if eq $storage "s3" }}
{{- printf "Checkpoints: %s, S3-compatible object storage (credentials from the pod's env, e.g. --env-from secret:NAME, or its cloud role; the image needs kubeddp[s3]). The cluster must offer: network access to the S3 endpoint; no volume." $dir }}
{{- else }}
{{- printf "Checkpoints: %s is an emptyDir (checkpoints.lostOnRetry), lost with the pod: every retry starts training from scratch. The cluster must offer: nothing." $dir }}
{{- end }}
{{- end }}

{{/* Checkpoint storage rules: impossible access modes, checkpoint.dir off the volume */}}
{{- define "kubeddp.validateCheckpoints" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $v := .Values.checkpoints }}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- $storage := include "kubeddp.checkpointStorage" . }}
{{- if and $v.storage $v.lostOnRetry }}
{{- fail (printf "`checkpoints.storage` (%s) and `checkpoints.lostOnRetry` are both set: lostOnRetry keeps the checkpoints on an emptyDir only; drop one" $v.storage) }}
{{- end }}
{{- if and (eq $storage "mount") (gt $nodes 1) (has (toString $v.accessMode) (list "ReadWriteOnce" "ReadWriteOncePod")) }}
{{- fail (printf "`checkpoints.accessMode` %s with %d pods and `checkpoints.storage` mount cannot run: %s; leave `checkpoints.storage` unset (a keeper pod holds the claim) or use ReadWriteMany storage" $v.accessMode $nodes (ternary "a ReadWriteOncePod claim admits one pod in the whole cluster" "a ReadWriteOnce volume attaches to one node and pods on the others fail with Multi-Attach" (eq $v.accessMode "ReadWriteOncePod"))) }}
{{- end }}
{{- $dir := include "kubeddp.checkpointDir" . }}
{{- if eq $storage "s3" }}
{{- range $key := list "storage" "existingClaim" "accessMode" "size" "storageClassName" "lostOnRetry" }}
{{- if get $v $key }}
{{- fail (printf "`checkpoints.%s` is set but `config.checkpoint.dir` is %s: S3 checkpoints need no volume; drop one" $key $dir) }}
{{- end }}
{{- end }}
{{- else }}
{{- if not (regexMatch "^(/[A-Za-z0-9._@+-]+)+$" $dir) }}
{{- fail (printf "`config.checkpoint.dir` %q is not an absolute, clean path: the checkpoints volume is mounted there; write e.g. /checkpoints or /data/ck" $dir) }}
{{- end }}
{{- range $c.checkpointDirReserved }}
{{- if or (eq $dir .) (hasPrefix (printf "%s/" .) $dir) (hasPrefix (printf "%s/" $dir) .) }}
{{- fail (printf "`config.checkpoint.dir` %s would put the checkpoints volume on or over %s, which the pod needs for itself; choose another path, e.g. /checkpoints" $dir .) }}
{{- end }}
{{- end }}
{{- range $.Values.volumes }}
{{- $path := trimSuffix "/" .mountPath }}
{{- if or (eq $dir $path) (hasPrefix (printf "%s/" $path) $dir) (hasPrefix (printf "%s/" $dir) $path) }}
{{- fail (printf "`config.checkpoint.dir` %s lies on the volume %s mounted at %s, where kubeddp cannot make it durable: to keep checkpoints on your own claim give it as `checkpoints.existingClaim`, or choose a path outside %s" $dir .name .mountPath .mountPath) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
