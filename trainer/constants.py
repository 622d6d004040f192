"""One source of truth for defaults shared by the trainer, `kubeddp render` and the Helm chart.

A test (tests/unit/test_chart_defaults.py) proves the chart's values.yaml agrees with these.
"""

from __future__ import annotations

# Ports
PYTORCHJOB_PORT = 23456  # Training Operator v1 default for the port named `pytorchjob-port`
PYTORCHJOB_PORT_NAME = "pytorchjob-port"
TRAINJOB_PORT = 29500  # Kubeflow Trainer v2 constants.ContainerTrainerPort
INDEXEDJOB_PORT = 29500
METRICS_PORT = 9400
METRICS_PORT_NAME = "metrics"

# Container names the operators look for
PYTORCHJOB_CONTAINER = "pytorch"
TRAINJOB_CONTAINER = "node"
INDEXEDJOB_CONTAINER = "trainer"

# Paths inside the image (writable with a read-only root filesystem: volumes/emptyDirs)
CHECKPOINT_DIR = "/checkpoints"
CONFIG_DIR = "/etc/kubeddp"
CONFIG_FILE = "/etc/kubeddp/config.yaml"
SCRATCH_DIR = "/tmp"  # metrics multiprocess files, caches, torch compile/inductor dirs
SHM_SIZE_DEFAULT = "8Gi"

# Image
# The image entrypoint. Written explicitly where a runtime may override it (TrainJob runtimes
# can set their own `command`).
IMAGE_ENTRYPOINT = ("tini", "--", "kubeddp", "launch")
IMAGE_REPOSITORY = "ghcr.io/kubeddp/kubeddp"
IMAGE_UID = 1000
# The CPU image as built locally and loaded into kind (`kind load docker-image`); CI and
# k8s/pytorchjob-cpu-gloo.yaml use this exact reference with imagePullPolicy IfNotPresent.
IMAGE_CPU_LOCAL = "kubeddp:cpu"

# Pod security: the restricted Pod Security Standard
CONTAINER_SECURITY_CONTEXT: dict = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": IMAGE_UID,
    "runAsGroup": IMAGE_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY_CONTEXT: dict = {
    "runAsNonRoot": True,
    "runAsUser": IMAGE_UID,
    "runAsGroup": IMAGE_UID,
    "fsGroup": IMAGE_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}

# Preemption: workers save within this many seconds of SIGTERM; pods get more than that.
PREEMPT_GRACE_SECONDS = 60
TERMINATION_GRACE_PERIOD_SECONDS = 120
# Exit code of a worker that saved a checkpoint after SIGTERM: >= 128 is retryable under
# PyTorchJob restartPolicy ExitCode (128 + SIGTERM).
PREEMPTED_EXIT_CODE = 143

# Labels
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
APP_NAME = "kubeddp"
# Pod labels the operators set (PodMonitor selects by them and carries them as target labels)
PYTORCHJOB_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
PYTORCHJOB_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
PYTORCHJOB_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
TRAINJOB_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
INDEXEDJOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEXEDJOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

# Istio: sidecars break rendezvous; this annotation opts the pod out.
ISTIO_INJECT_ANNOTATION = "sidecar.istio.io/inject"

# Environment variables kubeddp itself reads
ENV_CONFIG = "KUBEDDP_CONFIG"
ENV_CPU_NPROC = "KUBEDDP_CPU_NPROC"  # workers per CPU-only node when nproc is auto/cpu (default 1)
ENV_METRICS_PORT = "KUBEDDP_METRICS_PORT"
ENV_METRICS_BIND = "KUBEDDP_METRICS_BIND"
ENV_RDZV_WAIT_SECONDS = "KUBEDDP_RDZV_WAIT_SECONDS"
ENV_DRY_RUN_GPUS = "KUBEDDP_DRY_RUN_GPUS"  # --dry-run only: pretend this many GPUs are visible
ENV_SKIP_TORCH_CHECK = "KUBEDDP_SKIP_TORCH_CHECK"  # "1": launch on a torch outside the range
ENV_INDEXEDJOB_MASTER_ADDR = "KUBEDDP_MASTER_ADDR"
ENV_INDEXEDJOB_MASTER_PORT = "KUBEDDP_MASTER_PORT"
ENV_INDEXEDJOB_NNODES = "KUBEDDP_NNODES"
ENV_INDEXEDJOB_NPROC = "KUBEDDP_NPROC_PER_NODE"
# Rank 0 writes per-step wall-clock times here as JSON at the end of fit (tests/bench reads it)
ENV_SUMMARY_FILE = "KUBEDDP_SUMMARY_FILE"
# Metrics (trainer/metrics.py, trainer/metrics_server.py)
ENV_METRICS_LINGER = "KUBEDDP_METRICS_LINGER_SECONDS"  # keep /metrics up after training ends
ENV_RDZV_SOURCE = "KUBEDDP_RDZV_SOURCE"  # set by launch for workers; shown in kubeddp_info
ENV_PROMETHEUS_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own variable
METRICS_DIR_PREFIX = "kubeddp-metrics-"  # fresh per launch, under SCRATCH_DIR
