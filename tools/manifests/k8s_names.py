"""Kubernetes names and pod facts of kubeddp's objects: labels, port names, the image, security.

The Helm chart reads these through its generated templates/_constants.tpl (`make chart`), the
kinds (tools/manifests/kinds/) and the validators import them. Names that belong to one kind (its
container, the labels its operator sets) live in that kind's module. Facts the trainer needs
too (ports, KUBEDDP_* env names, paths in the image, exit codes) stay in
kubeddp.trainer.constants.
"""

from __future__ import annotations

import posixpath

from kubeddp.trainer import constants as trainer
from kubeddp.trainer import exit_codes, storage_rules

APP_NAME = "kubeddp"

# The recommended labels; the job's pods carry name, instance, managed-by and component=trainer.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
TRAINER_COMPONENT = "trainer"
METRICS_COMPONENT = "metrics"  # PodMonitors

# Istio: a sidecar breaks the rendezvous; this annotation opts the pod out.
ISTIO_INJECT_ANNOTATION = "sidecar.istio.io/inject"
# Kueue admits a job that carries this label through the named LocalQueue.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue's Topology-Aware Scheduling: the pod template annotation that places a PodSet's pods in
# one domain of the named topology level (required: wait for one; preferred: else go wider)
KUEUE_TOPOLOGY_ANNOTATIONS = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
GPU_RESOURCE = "nvidia.com/gpu"

# Ports and paths of the training container
METRICS_PORT_NAME = "metrics"
METRICS_PATH = "/metrics"
CONFIG_DIR = storage_rules.CONFIG_DIR
CONFIG_KEY = posixpath.basename(trainer.CONFIG_FILE)  # the ConfigMap key mounted as that file
SHM_DIR = storage_rules.SHM_DIR
# The pod's own volumes (templates/_pod.tpl); a user's extra volume takes another name.
KEEPER_TOKEN_VOLUME = "keeper-token"  # the job's keeper secret, mounted read-only
KUBEDDP_VOLUMES = ("config", "checkpoints", "dshm", "tmp", KEEPER_TOKEN_VOLUME)
# Where a user's volume may not be mounted: the checkpoints' place and where the checkpoints may
# not be (kubeddp's other mounts and the image's paths: trainer/storage_rules.py).
RESERVED_MOUNT_PATHS = (storage_rules.POD_DIR, *storage_rules.RESERVED)

# The image. The entrypoint is written out where a runtime may replace it (TrainJob runtimes
# set their own `command`).
IMAGE_REPOSITORY = "ghcr.io/kubeddp/kubeddp"
IMAGE_ENTRYPOINT = ("tini", "--", "kubeddp", "launch")
IMAGE_UID = 1000
# The checkpoint keeper pod (templates/keeper.yaml): it only moves files
# on the job object: the one line that says where checkpoints live and what the cluster must
# offer (what `helm install` prints in NOTES; `helm template` prints no NOTES)
CHECKPOINTS_ANNOTATION = "kubeddp.io/checkpoints"
# The job object's line on its network.fabric: what the pods request, the Pod Security level
# they need (render prints it, as the chart's NOTES do)
NETWORK_ANNOTATION = "kubeddp.io/network"
KEEPER_LABEL = "kubeddp.io/checkpoint-keeper"  # value: the keeper's name; its Service selects it
# the keeper's objects are named <job> + these: its Deployment, Service and NetworkPolicy; the
# Secret with the job's keeper secret (templates/_keeper.tpl; `kubeddp delete` removes them)
KEEPER_SUFFIX = "-keeper"
KEEPER_TOKEN_SUFFIX = "-keeper-token"
# The CPU image as built locally and loaded into kind (`kind load docker-image`); CI and
# k8s/pytorchjob-cpu-gloo.yaml use this exact reference with imagePullPolicy IfNotPresent.
IMAGE_CPU_LOCAL = "kubeddp:cpu"

# Pod security: the restricted Pod Security Standard; the root filesystem is read-only (/tmp,
# /dev/shm and /checkpoints are volumes).
POD_SECURITY_CONTEXT: dict = {
    "runAsNonRoot": True,
    "runAsUser": IMAGE_UID,
    "runAsGroup": IMAGE_UID,
    "fsGroup": IMAGE_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": IMAGE_UID,
    "runAsGroup": IMAGE_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
    "readOnlyRootFilesystem": True,
}

# Workers save within PREEMPT_GRACE_SECONDS of SIGTERM; the pod gets more than that.
TERMINATION_GRACE_PERIOD_SECONDS = trainer.TERMINATION_GRACE_SECONDS
# Exit codes below this are the program's own failures (retrying cannot help); from it on they
# are retried, like PyTorchJob's ExitCode (trainer/exit_codes.py).
FIRST_RETRYABLE_EXIT_CODE = exit_codes.RETRYABLE_FROM
# A batch/v1 Job's pods carry their completion index (Indexed Jobs, and JobSet's Jobs).
JOB_COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
