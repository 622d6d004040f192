{{/*
Rules that span several values; values.schema.json checks each value on its own. They mirror
`kubeddp render`'s checks (tools/jobspec.py), and each message names the value and the fix.
*/}}
{{- define "kubeddp.validate" -}}
{{- $v := .Values }}
{{- $job := include "kubeddp.fullname" . }}
{{- $nodes := include "kubeddp.nodes" . | int }}
{{- $nproc := include "kubeddp.nproc" . }}
{{- $isCount := regexMatch "^[0-9]+$" $nproc }}
{{- if or (not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $job)) (gt (len $job) 40) }}
{{- fail (printf "job name %q is not a DNS-1035 label of at most 40 characters: use lower-case letters, digits and '-', starting with a letter (set fullnameOverride or pick another release name)" $job) }}
{{- end }}
{{- if lt $nodes 1 }}
{{- fail (printf "nodes is %d; a job needs at least 1 node" $nodes) }}
{{- end }}
{{- if and (gt (int $v.gpusPerNode) 0) $isCount (gt (atoi $nproc) (int $v.gpusPerNode)) }}
{{- fail (printf "nprocPerNode is %s but gpusPerNode is %d: use at most one process per GPU" $nproc (int $v.gpusPerNode)) }}
{{- end }}
{{- if $v.elastic.enabled }}
{{- if gt (int $v.elastic.minNodes) (int $v.elastic.maxNodes) }}
{{- fail (printf "elastic.minNodes (%d) is greater than elastic.maxNodes (%d): make minNodes <= maxNodes" (int $v.elastic.minNodes) (int $v.elastic.maxNodes)) }}
{{- end }}
{{- if or (lt $nodes (int $v.elastic.minNodes)) (gt $nodes (int $v.elastic.maxNodes)) }}
{{- fail (printf "nodes (%d) is outside elastic.minNodes..elastic.maxNodes (%d..%d): pick a count in between, or leave nodes null" $nodes (int $v.elastic.minNodes) (int $v.elastic.maxNodes)) }}
{{- end }}
{{- end }}
{{- if ne $v.kind "PyTorchJob" }}
{{- if $v.elastic.enabled }}
{{- fail (printf "elastic.enabled is for kind PyTorchJob, not %s (its node count is fixed): set kind=PyTorchJob or elastic.enabled=false" $v.kind) }}
{{- end }}
{{- if $v.gang.scheduler }}
{{- fail (printf "gang.scheduler=%s is for kind PyTorchJob, not %s: use kueue.queueName to admit the job as a whole" $v.gang.scheduler $v.kind) }}
{{- end }}
{{- if not (kindIs "invalid" $v.cleanPodPolicy) }}
{{- fail (printf "cleanPodPolicy is for kind PyTorchJob, not %s: leave it null" $v.kind) }}
{{- end }}
{{- end }}
{{- if eq $v.kind "TrainJob" }}
{{- range $key := list "restartPolicy" "backoffLimit" "ttlSecondsAfterFinished" }}
{{- if not (kindIs "invalid" (index $v $key)) }}
{{- fail (printf "%s cannot be set on a TrainJob (Trainer v2.3 runtimePatches have no such field): leave it null and set it in the ClusterTrainingRuntime, or use kind PyTorchJob" $key) }}
{{- end }}
{{- end }}
{{- if $v.priorityClassName }}
{{- fail "priorityClassName cannot be set on a TrainJob (Trainer v2.3 runtimePatches have no such field): set it in the ClusterTrainingRuntime, or use kind PyTorchJob" }}
{{- end }}
{{- if not (or $isCount (eq $nproc "auto")) }}
{{- fail (printf "nprocPerNode %q is not valid for a TrainJob (numProcPerNode is an integer): use a count, or auto to let the runtime decide" $nproc) }}
{{- end }}
{{- end }}
{{- if and (eq $v.kind "IndexedJob") (eq (toString $v.restartPolicy) "Always") }}
{{- fail "restartPolicy Always is not valid for an IndexedJob: use ExitCode, OnFailure or Never" }}
{{- end }}
{{- if and $v.checkpoints.existingClaim $v.checkpoints.size }}
{{- fail (printf "checkpoints.existingClaim (%s) and checkpoints.size (%s) are both set: mount an existing claim or create a new one, not both" $v.checkpoints.existingClaim $v.checkpoints.size) }}
{{- end }}
{{- if and $v.checkpoints.storageClassName (not $v.checkpoints.size) }}
{{- fail (printf "checkpoints.storageClassName (%s) applies to a new claim only: set checkpoints.size too" $v.checkpoints.storageClassName) }}
{{- end }}
{{- $workload := default dict $v.config.workload }}
{{- if and (eq (toString $workload.name) "custom") (not (and $workload.model $workload.data)) }}
{{- fail "config.workload.name is custom but config.workload.model/data are empty: set both to 'pkg.module:factory'" }}
{{- end }}
{{- end }}
