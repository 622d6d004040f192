{{/*
The pod of _pod.tpl as a TrainJob carries it; dict as for kubeddp.podTemplate. Gives
{trainer: the training container's fields spec.trainer has (resources as resourcesPerNode),
patch: the pod template of its runtimePatches}. The table is read from the Trainer CRD
(tools/manifests/kinds/trainjob_fields.py): a field in neither part is the runtime's, and
tools/manifests/kinds/trainjob.py refuses the values that write one.
*/}}
{{- define "kubeddp.trainJobPod" -}}
{{- $c := include "kubeddp.constants" .root | fromYaml }}
{{- $split := (index $c.kinds "TrainJob").podSplit }}
{{- $pod := include "kubeddp.podTemplate" . | fromYaml }}
{{- $container := first $pod.spec.containers }}
{{- $trainer := dict }}
{{- range $field, $to := $split.trainer }}
{{- if hasKey $container $field }}
{{- $_ := set $trainer $to (get $container $field) }}
{{- end }}
{{- end }}
{{- $patched := dict "name" $container.name }}
{{- range $split.container }}
{{- if hasKey $container . }}
{{- $_ := set $patched . (get $container .) }}
{{- end }}
{{- end }}
{{- $spec := dict "containers" (list $patched) }}
{{- range $split.spec }}
{{- if hasKey $pod.spec . }}
{{- $_ := set $spec . (get $pod.spec .) }}
{{- end }}
{{- end }}
{{- $metadata := dict }}
{{- range $split.metadata }}
{{- if hasKey $pod.metadata . }}
{{- $_ := set $metadata . (get $pod.metadata .) }}
{{- end }}
{{- end }}
{{- toYaml (dict "trainer" $trainer "patch" (dict "metadata" $metadata "spec" $spec)) }}
{{- end }}
