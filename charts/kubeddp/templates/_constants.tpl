{{/*
The chart's copy of kubeddp's trainer/constants.py: fixed by the operators and the image, not
values. tests/unit/test_chart_defaults.py checks every entry against constants.py.
Use: $c := include "kubeddp.constants" . | fromYaml
*/}}
{{- define "kubeddp.constants" -}}
pytorchjobPort: 23456
pytorchjobPortName: pytorchjob-port
indexedjobPort: 29500
indexedjobPortName: rendezvous
metricsPort: 9400
metricsPortName: metrics
pytorchjobContainer: pytorch
trainjobContainer: node
indexedjobContainer: trainer
checkpointDir: /checkpoints
configDir: /etc/kubeddp
configFile: /etc/kubeddp/config.yaml
configKey: config.yaml
scratchDir: /tmp
gpuResource: nvidia.com/gpu
istioInjectAnnotation: sidecar.istio.io/inject
kueueQueueLabel: kueue.x-k8s.io/queue-name
pytorchjobJobNameLabel: training.kubeflow.org/job-name
pytorchjobReplicaTypeLabel: training.kubeflow.org/replica-type
pytorchjobReplicaIndexLabel: training.kubeflow.org/replica-index
trainjobNameLabel: jobset.sigs.k8s.io/jobset-name
indexedjobNameLabel: batch.kubernetes.io/job-name
indexedjobIndexLabel: batch.kubernetes.io/job-completion-index
masterAddrEnv: KUBEDDP_MASTER_ADDR
trainjobPort: 29500
entrypoint: ["tini", "--", "kubeddp", "launch"]
masterPortEnv: KUBEDDP_MASTER_PORT
nnodesEnv: KUBEDDP_NNODES
nprocEnv: KUBEDDP_NPROC_PER_NODE
trainjobReplicatedJob: node
runtimePatchManager: kubeddp.io/render
defaultRestartPolicy: ExitCode
defaultBackoffLimit: 3
defaultCleanPodPolicy: Running
{{- end }}
