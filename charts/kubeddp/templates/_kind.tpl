{{/*
The kind of job this release runs: the `kind` value, or for `kind: auto` the kind the cluster
serves. Every template that switches on the kind reads it here, never .Values.kind.

auto, in order:
- `helm upgrade`: the kind of the job the release already runs (a lookup of <job> among the
  kinds whose API is served), so an operator installed later does not replace a running job;
- the first of $c.autoKinds whose API Helm's capabilities list (Trainer's TrainJob, then
  training-operator's PyTorchJob), else the last (an Indexed Job: batch/v1, every cluster).

What Helm gives: `helm install`/`upgrade` (and `--dry-run=server`, `helm template --validate`)
read the cluster's API discovery; `helm template` lists only the built-in API groups plus what
--api-versions names (e.g. --api-versions trainer.kubeflow.org/v1alpha1/TrainJob), and its
lookup finds nothing; so does Helm 4's `helm install --dry-run=client` (Helm 3's
`install --dry-run` reads the cluster's discovery, with lookup off).
*/}}
{{- define "kubeddp.kind" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if ne .Values.kind $c.autoKind }}
{{- .Values.kind }}
{{- else }}
{{- $picked := "" }}
{{- if .Release.IsUpgrade }}
{{- $ns := default .Release.Namespace .Values.namespaceOverride }}
{{- $job := include "kubeddp.fullname" . }}
{{- range $name := $c.autoKinds }}
{{- $k := index $c.kinds $name }}
{{- if and (not $picked) ($.Capabilities.APIVersions.Has $k.apiKey) }}
{{- if lookup $k.apiVersion $k.resourceKind $ns $job }}
{{- $picked = $name }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name := initial $c.autoKinds }}
{{- if and (not $picked) ($.Capabilities.APIVersions.Has (index $c.kinds $name).apiKey) }}
{{- $picked = $name }}
{{- end }}
{{- end }}
{{- default (last $c.autoKinds) $picked }}
{{- end }}
{{- end }}

{{/* Why kind auto gave the kind it gave, for NOTES.txt; empty for a kind given by name. */}}
{{- define "kubeddp.kindReason" -}}
{{- $c := include "kubeddp.constants" . | fromYaml }}
{{- if eq .Values.kind $c.autoKind }}
{{- $kind := include "kubeddp.kind" . }}
{{- $k := index $c.kinds $kind }}
{{- if eq $kind (last $c.autoKinds) }}
{{- printf "kind auto: %s, since Helm sees the API of neither %s (set kind to choose; helm template: --api-versions)" $kind (join " nor " (initial $c.autoKinds)) }}
{{- else }}
{{- printf "kind auto: %s, since the cluster serves %s (set kind to choose another)" $kind $k.apiKey }}
{{- end }}
{{- end }}
{{- end }}
