{{/*
Where the checkpoints live, decided here alone from the rules of trainer/storage_rules.py
($c.storage, which the trainer reads too). One of:
  <scheme> checkpoint.dir is SCHEME://... (s3): object storage, no claim
  emptyDir checkpoints.lostOnRetry: lost with the pod
  keeper   one keeper pod mounts the claim (ReadWriteOnce is enough); training pods keep
           checkpoint.dir on an emptyDir that launch fills from it and syncs back
  mount    every training pod mounts the claim at checkpoint.dir (several pods: ReadWriteMany)
*/}}
{{- define "kubeddp.checkpointStorage" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $s := $c.storage }}
{{- $v := .Values.checkpoints }}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- $store := include "kubeddp.objectStore" . }}
{{- if $store }}{{ $store }}
{{- else if $v.lostOnRetry }}{{ $s.emptyDir }}
{{- else if $v.storage }}{{ $v.storage }}
{{- else if and (gt $nodes 1) (ne (toString $v.accessMode) "ReadWriteMany") }}{{ $s.keeper }}
{{- else }}{{ $s.mount }}{{ end }}
{{- end }}

{{/* the scheme of the object store checkpoint.dir names (SCHEME:..., any case), else empty */}}
{{- define "kubeddp.objectStore" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $dir := include "kubeddp.checkpointDir" . }}
{{- $scheme := splitList ":" $dir | first | lower }}
{{- if and (contains ":" $dir) (hasKey $c.storage.objectStores $scheme) }}{{ $scheme }}{{ end }}
{{- end }}

{{/* checkpoint.dir as the pods see it: the checkpoints volume is mounted exactly there */}}
{{- define "kubeddp.checkpointDir" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $checkpoint := get (.Values.config | default dict) "checkpoint" | default dict }}
{{- get $checkpoint "dir" | default $c.storage.podDir }}
{{- end }}

{{/* where the checkpoints volume is mounted: checkpoint.dir, or scratch space for an object
store */}}
{{- define "kubeddp.checkpointMountPath" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- ternary $c.storage.podDir (include "kubeddp.checkpointDir" .) (not (empty (include "kubeddp.objectStore" .))) }}
{{- end }}

{{/* "true" when the checkpoints go through the keeper pod (templates/keeper.yaml) */}}
{{- define "kubeddp.checkpointKeeper" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if eq (include "kubeddp.checkpointStorage" .) $c.storage.keeper }}true{{ end }}
{{- end }}

{{/* "true" when kubeddp creates the checkpoint claim (templates/pvc.yaml) */}}
{{- define "kubeddp.checkpointClaimCreated" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if and (not .Values.checkpoints.existingClaim) (has (include "kubeddp.checkpointStorage" .) (list $c.storage.keeper $c.storage.mount)) }}true{{ end }}
{{- end }}

{{- define "kubeddp.keeperName" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- printf "%s%s" (include "kubeddp.fullname" .) $c.keeperSuffix }}
{{- end }}

{{/* the access mode of the claim kubeddp creates */}}
{{- define "kubeddp.checkpointAccessMode" -}}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- $shared := and (not (empty (include "kubeddp.checkpointClaimMounted" .))) (gt $nodes 1) }}
{{- default (ternary "ReadWriteMany" "ReadWriteOnce" $shared) .Values.checkpoints.accessMode }}
{{- end }}

{{/* env of the training container for the storage: the keeper's address, its secret's file
and the pod's grace period (the bound of the last send); a user's program starts in
checkpoint.dir (a relative snapshot.pt lands on the kept storage) */}}
{{- define "kubeddp.storageEnv" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if include "kubeddp.checkpointKeeper" . }}
- name: {{ $c.keeperEnv }}
  value: {{ printf "http://%s:%d" (include "kubeddp.keeperName" .) (int $c.keeperPort) | quote }}
- name: {{ $c.keeperTokenEnv }}
  value: {{ include "kubeddp.keeperTokenFile" . }}
- name: {{ $c.terminationGraceEnv }}
  value: {{ include "kubeddp.terminationGrace" . | quote }}
{{- end }}
{{- if or .Values.trainer.script .Values.trainer.module }}
- name: {{ $c.programInCheckpointDirEnv }}
  value: "1"
{{- end }}
{{- end }}

{{/* One line: the storage this job uses and what the cluster must offer (NOTES, render) */}}
{{- define "kubeddp.storageLine" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $storage := include "kubeddp.checkpointStorage" . }}
{{- $dir := include "kubeddp.checkpointDir" . }}
{{- $claim := include "kubeddp.checkpointClaimName" . }}
{{- $class := ternary "an existing claim" (printf "StorageClass %s" (default "(the cluster's default)" .Values.checkpoints.storageClassName)) (not (empty .Values.checkpoints.existingClaim)) }}
{{- $mode := ternary "its own access mode" (include "kubeddp.checkpointAccessMode" .) (not (empty .Values.checkpoints.existingClaim)) }}
{{- if eq $storage $c.storage.keeper }}
{{- printf "Checkpoints: claim %s (%s, %s) mounted only by the keeper pod %s; every training pod keeps %s on an emptyDir filled from it and synced back. The cluster must offer: any StorageClass (ReadWriteOnce is enough)." $claim $mode $class (include "kubeddp.keeperName" .) $dir }}
{{- else if eq $storage $c.storage.mount }}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- printf "Checkpoints: claim %s (%s, %s) mounted at %s in every pod. The cluster must offer: %s." $claim $mode $class $dir (ternary "ReadWriteMany storage (EFS, Filestore, Azure Files, NFS...): the pods run on several nodes" "any StorageClass" (gt $nodes 1)) }}
{{- else if hasKey $c.storage.objectStores $storage }}
{{- printf "Checkpoints: %s, %s. The cluster must offer: network access to the %s endpoint; no volume." $dir (get $c.storage.objectStores $storage) (upper $storage) }}
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
{{- if and (eq $storage $c.storage.mount) (gt $nodes 1) (has (toString $v.accessMode) (list "ReadWriteOnce" "ReadWriteOncePod")) }}
{{- fail (printf "`checkpoints.accessMode` %s with %d pods and `checkpoints.storage` mount cannot run: %s; leave `checkpoints.storage` unset (a keeper pod holds the claim) or use ReadWriteMany storage" $v.accessMode $nodes (ternary "a ReadWriteOncePod claim admits one pod in the whole cluster" "a ReadWriteOnce volume attaches to one node and pods on the others fail with Multi-Attach" (eq $v.accessMode "ReadWriteOncePod"))) }}
{{- end }}
{{- $dir := include "kubeddp.checkpointDir" . }}
{{- $store := include "kubeddp.objectStore" . }}
{{- if $store }}
{{- if not (regexMatch (get $c.storage.objectStoreUrls $store) $dir) }}
{{- fail (printf "`config.checkpoint.dir` %q names object storage (%s) but is not a valid %s:// URL: write %s://BUCKET/PREFIX (the prefix: no empty, `.` or `..` part, which would put the checkpoints outside it)" $dir $store $store $store) }}
{{- end }}
{{- range $key := list "storage" "existingClaim" "accessMode" "size" "storageClassName" "lostOnRetry" }}
{{- if get $v $key }}
{{- fail (printf "`checkpoints.%s` is set but `config.checkpoint.dir` is %s: %s checkpoints need no volume; drop one" $key $dir (upper $store)) }}
{{- end }}
{{- end }}
{{- else }}
{{- if not (regexMatch $c.storage.volumeDir $dir) }}
{{- fail (printf "`config.checkpoint.dir` %q is not an absolute, clean path: the checkpoints volume is mounted there; write e.g. %s or /data/ck" $dir $c.storage.podDir) }}
{{- end }}
{{- range $c.storage.reserved }}
{{- if or (eq $dir .) (hasPrefix (printf "%s/" .) $dir) (hasPrefix (printf "%s/" $dir) .) }}
{{- fail (printf "`config.checkpoint.dir` %s would put the checkpoints volume on or over %s, which the pod needs for itself; choose another path, e.g. %s" $dir . $c.storage.podDir) }}
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
