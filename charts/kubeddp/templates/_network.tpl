{{/*
network.fabric (tools/manifests/chart/fabric.py: each profile adds what its provider documents) and
placement (one topology domain for the job's pods). _pod.tpl writes what these give into the
one training pod; the rules that refuse what cannot work are kubeddp.validateNetwork.
*/}}

{{/* the extended resource each pod requests for the fabric; empty: none */}}
{{- define "kubeddp.fabricResource" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $n := .Values.network }}
{{- if has $n.fabric $c.fabric.deviceFabrics }}
{{- $n.deviceResource | default (ternary $c.fabric.efaResource "" (eq $n.fabric "efa")) }}
{{- end }}
{{- end }}

{{/* how many of them: network.devices, else efa's count for network.instanceType, else 1 */}}
{{- define "kubeddp.fabricDevices" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $n := .Values.network }}
{{- if not (kindIs "invalid" $n.devices) }}
{{- $n.devices | int }}
{{- else if and (eq $n.fabric "efa") (hasKey $c.fabric.efaDevices $n.instanceType) }}
{{- get $c.fabric.efaDevices $n.instanceType | int }}
{{- else }}
{{- 1 }}
{{- end }}
{{- end }}

{{/* the training container's securityContext: an RDMA fabric adds the capability that pins
memory (ibv_reg_mr) */}}
{{- define "kubeddp.containerSecurityContext" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $context := deepCopy .Values.securityContext }}
{{- if has .Values.network.fabric $c.fabric.rdmaFabrics }}
{{- $capabilities := get $context "capabilities" | default dict }}
{{- $add := get $capabilities "add" | default list }}
{{- if not (has $c.fabric.rdmaCapability $add) }}
{{- $_ := set $capabilities "add" (append $add $c.fabric.rdmaCapability) }}
{{- end }}
{{- $_ := set $context "capabilities" $capabilities }}
{{- end }}
{{- toYaml $context }}
{{- end }}

{{/* the training pods' affinity: values.affinity plus, with placement.topologyKey and no
Kueue queue (Kueue places the pods itself: kubeddp.podMetadata's annotation), a pod affinity
to the job's other training pods in the same topology domain, required or preferred */}}
{{- define "kubeddp.trainingAffinity" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $affinity := deepCopy .Values.affinity }}
{{- $key := .Values.placement.topologyKey }}
{{- if and $key (not .Values.kueue.queueName) }}
{{- $labels := include "kubeddp.selectorLabels" . | fromYaml }}
{{- $_ := set $labels $c.labelComponent $c.trainerComponent }}
{{- $term := dict "labelSelector" (dict "matchLabels" $labels) "topologyKey" $key }}
{{- $podAffinity := get $affinity "podAffinity" | default dict }}
{{- if eq .Values.placement.mode "required" }}
{{- $terms := get $podAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default list }}
{{- $_ := set $podAffinity "requiredDuringSchedulingIgnoredDuringExecution" (append $terms $term) }}
{{- else }}
{{- $terms := get $podAffinity "preferredDuringSchedulingIgnoredDuringExecution" | default list }}
{{- $weighted := dict "weight" 100 "podAffinityTerm" $term }}
{{- $_ := set $podAffinity "preferredDuringSchedulingIgnoredDuringExecution" (append $terms $weighted) }}
{{- end }}
{{- $_ := set $affinity "podAffinity" $podAffinity }}
{{- end }}
{{- with $affinity }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* the pod annotation that asks Kueue's Topology-Aware Scheduling for one domain */}}
{{- define "kubeddp.topologyAnnotations" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $annotations := dict }}
{{- if and .Values.placement.topologyKey .Values.kueue.queueName }}
{{- $_ := set $annotations (get $c.kueueTopologyAnnotations .Values.placement.mode) .Values.placement.topologyKey }}
{{- end }}
{{- toYaml $annotations }}
{{- end }}

{{/* One line for a fabric other than socket (NOTES, render): what the pods request and the
Pod Security level they need */}}
{{- define "kubeddp.networkLine" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $n := .Values.network }}
{{- if ne $n.fabric $c.fabric.socket }}
{{- $level := get $c.fabric.levelNeeded $n.fabric }}
{{- $resource := include "kubeddp.fabricResource" . }}
{{- $what := ternary (printf "%s %s per pod" (include "kubeddp.fabricDevices" .) $resource) "the node's network, no devices" (not (empty $resource)) }}
{{- $count := "" }}
{{- if and (eq $n.fabric "efa") (kindIs "invalid" $n.devices) (not (hasKey $c.fabric.efaDevices $n.instanceType)) }}
{{- $count = " (network.instanceType and network.devices not set: a p5.48xlarge has 32)" }}
{{- end }}
{{- $pss := printf "the pods keep Pod Security level %s" $level }}
{{- with get $c.fabric.whyLevel $n.fabric }}
{{- $pss = printf "the pods need Pod Security level %s (%s): the namespace's pod-security.kubernetes.io/enforce label must be %s" $level . $level }}
{{- end }}
{{- printf "Network: fabric %s, %s%s; %s%s." $n.fabric $what $count $pss (ternary (printf " (podSecurityLevel %s)" .Values.podSecurityLevel) "" (not (empty .Values.podSecurityLevel))) }}
{{- end }}
{{- end }}

{{/* network.fabric and placement: what cannot be admitted or cannot work */}}
{{- define "kubeddp.validateNetwork" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- $n := .Values.network }}
{{- $devices := has $n.fabric $c.fabric.deviceFabrics }}
{{- if and (not $devices) (or $n.deviceResource (not (kindIs "invalid" $n.devices))) }}
{{- fail (printf "`network.deviceResource`/`network.devices` are set but `network.fabric` %s requests no devices: drop them, or pick efa, infiniband or roce" $n.fabric) }}
{{- end }}
{{- if and $n.instanceType (ne $n.fabric "efa") }}
{{- fail (printf "`network.instanceType` (%s) gives efa its device count, but `network.fabric` is %s: drop it" $n.instanceType $n.fabric) }}
{{- end }}
{{- if and (has $n.fabric $c.fabric.rdmaFabrics) (not $n.deviceResource) }}
{{- fail (printf "`network.deviceResource` is empty but `network.fabric` %s needs your RDMA device plugin's resource: e.g. rdma/ib (CoreWeave), rdma/<resourceName> (NVIDIA's RDMA shared device plugin) or your SR-IOV VF's (docs/network-fabric.md)" $n.fabric) }}
{{- end }}
{{- if and (eq $n.fabric "efa") $n.instanceType (kindIs "invalid" $n.devices) (not (hasKey $c.fabric.efaDevices $n.instanceType)) }}
{{- fail (printf "`network.instanceType` %s: its EFA count is not in kubeddp's list (%s): set `network.devices` (aws ec2 describe-instance-types --instance-types %s --query 'InstanceTypes[].NetworkInfo.EfaInfo.MaximumEfaInterfaces')" $n.instanceType (join ", " (keys $c.fabric.efaDevices | sortAlpha)) $n.instanceType) }}
{{- end }}
{{- if and (eq $n.fabric $c.fabric.hostNetwork) (eq (include "kubeddp.kind" .) "TrainJob") }}
{{- fail "`network.fabric` hostNetwork cannot be set for kind TrainJob: Trainer v2.3 runtimePatches have no hostNetwork or dnsPolicy; use kind PyTorchJob or IndexedJob, or set them in your runtime" }}
{{- end }}
{{- if and (ne .Values.placement.mode "required") (not .Values.placement.topologyKey) }}
{{- fail (printf "`placement.mode` is %s but `placement.topologyKey` is empty: name the node label of the domain (e.g. cloud.google.com/gce-topology-block), or drop the mode" .Values.placement.mode) }}
{{- end }}
{{- $level := get $c.fabric.levelNeeded $n.fabric }}
{{- $declared := .Values.podSecurityLevel }}
{{- if and $declared (gt (get $c.fabric.levelRank $level | int) (get $c.fabric.levelRank $declared | int)) }}
{{- fail (printf "`network.fabric` %s needs Pod Security level %s (%s) but `podSecurityLevel` says the namespace enforces %s, which refuses these pods: label the namespace pod-security.kubernetes.io/enforce=%s, or use fabric socket or efa" $n.fabric $level (get $c.fabric.whyLevel $n.fabric) $declared $level) }}
{{- end }}
{{- end }}
