{{/*
Rules that span several values (values.schema.json checks each value on its own).
Each message names the offending value and the fix.
*/}}
{{- define "kubeddp.validate" -}}
{{- $v := .Values }}
{{- $job := include "kubeddp.fullname" . }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $job) }}
{{- fail (printf "job name %q is not a DNS-1035 label: use lower-case letters, digits and '-', starting with a letter (set fullnameOverride)" $job) }}
{{- end }}
{{- if gt (len $job) 40 }}
{{- fail (printf "job name %q has %d characters; pod names derived from it need it at most 40 (set fullnameOverride)" $job (len $job)) }}
{{- end }}
{{- if lt (int $v.nodes) 1 }}
{{- fail (printf "nodes is %v; a job needs at least 1 node" $v.nodes) }}
{{- end }}
{{- $nproc := toString $v.nprocPerNode }}
{{- if and (regexMatch "^[0-9]+$" $nproc) (lt (atoi $nproc) 1) }}
{{- fail (printf "nprocPerNode is %s; use at least 1, or auto/cpu/gpu" $nproc) }}
{{- end }}
{{- if $v.elastic.enabled }}
{{- if ne $v.kind "PyTorchJob" }}
{{- fail (printf "elastic.enabled needs kind PyTorchJob, not %s (TrainJob and IndexedJob have a fixed node count): set kind=PyTorchJob or elastic.enabled=false" $v.kind) }}
{{- end }}
{{- if gt (int $v.elastic.minNodes) (int $v.elastic.maxNodes) }}
{{- fail (printf "elastic.minNodes (%v) is greater than elastic.maxNodes (%v); make minNodes <= maxNodes" $v.elastic.minNodes $v.elastic.maxNodes) }}
{{- end }}
{{- if or (lt (int $v.nodes) (int $v.elastic.minNodes)) (gt (int $v.nodes) (int $v.elastic.maxNodes)) }}
{{- fail (printf "nodes (%v) must lie between elastic.minNodes (%v) and elastic.maxNodes (%v)" $v.nodes $v.elastic.minNodes $v.elastic.maxNodes) }}
{{- end }}
{{- end }}
{{- if and (eq $v.kind "TrainJob") (not (regexMatch "^[0-9]+$" $nproc)) }}
{{- fail (printf "nprocPerNode is %q but a TrainJob (Trainer v2.2+) takes a count: set nprocPerNode to an integer" $nproc) }}
{{- end }}
{{- if and $v.gang.scheduler (ne $v.kind "PyTorchJob") }}
{{- fail (printf "gang.scheduler=%s needs kind PyTorchJob (the Training Operator creates the PodGroup); for %s use kueue.queueName, or the runtime's podGroupPolicy for a TrainJob" $v.gang.scheduler $v.kind) }}
{{- end }}
{{- if and (not (kindIs "invalid" $v.gang.minAvailable)) $v.gang.scheduler }}
{{- if gt (int $v.gang.minAvailable) (int $v.nodes) }}
{{- fail (printf "gang.minAvailable (%v) is greater than nodes (%v); the gang could never start" $v.gang.minAvailable $v.nodes) }}
{{- end }}
{{- end }}
{{- if and $v.priorityClassName (eq $v.kind "TrainJob") }}
{{- fail "priorityClassName cannot be set on a TrainJob (runtimePatches do not allow it): set it in the TrainingRuntime" }}
{{- end }}
{{- if and (ne $v.kind "PyTorchJob") (ne $v.restartPolicy "ExitCode") (ne $v.restartPolicy "Never") }}
{{- fail (printf "restartPolicy %s applies to PyTorchJob replicas only; %s pods always use Never (retries come from backoffLimit)" $v.restartPolicy $v.kind) }}
{{- end }}
{{- if and $v.checkpoints.existingClaim (not $v.checkpoints.persistence) }}
{{- fail (printf "checkpoints.existingClaim is %q but checkpoints.persistence is false: set checkpoints.persistence=true to mount it" $v.checkpoints.existingClaim) }}
{{- end }}
{{- if and $v.monitoring.podMonitor.enabled (not $v.metrics.enabled) }}
{{- fail "monitoring.podMonitor.enabled needs metrics.enabled=true (there is nothing to scrape)" }}
{{- end }}
{{- with $v.config.checkpoint }}{{ if hasKey . "dir" }}
{{- fail "config.checkpoint.dir is set by the chart (/checkpoints, the mounted volume); remove it and use checkpoints.* to choose the storage" }}
{{- end }}{{ end }}
{{- with $v.config.metrics }}{{ if hasKey . "port" }}
{{- fail "config.metrics.port is set by the chart from metrics.port; remove it and set metrics.port" }}
{{- end }}{{ end }}
{{- end }}
