"""Facts the trainer and the manifests share: the ports kubeddp defaults to, paths inside the
image, the environment variables kubeddp reads, and the preemption budget.

tools/ imports these (Kubernetes-only names live in tools/manifests/k8s_names.py) and `make chart`
writes the chart's copy (templates/_constants.tpl), so the chart and the trainer agree.
"""

from __future__ import annotations

# Ports
PYTORCHJOB_PORT = 23456  # Training Operator v1 default for the port named `pytorchjob-port`
TRAINJOB_PORT = 29500  # Kubeflow Trainer v2 constants.ContainerTrainerPort
INDEXEDJOB_PORT = 29500
TORCHRUN_PORT = 29500  # torchrun's --master-port default; `kubeddp train --master-addr` uses it
# Not 9400: dcgm-exporter listens there on GPU nodes (host network on bare metal and in some
# GPU Operator setups), and 9100-9999 is all allocated to Prometheus exporters. 8479 is outside
# that range, ML servers (6006, 8000, 8080, 8265, 8888), torchrun (29400, 29500) and ephemerals.
METRICS_PORT = 8479

# Paths inside the image (writable with a read-only root filesystem: volumes/emptyDirs)
CHECKPOINT_DIR = "/checkpoints"
CONFIG_FILE = "/etc/kubeddp/config.yaml"
SCRATCH_DIR = "/tmp"  # metrics multiprocess files, caches, torch compile/inductor dirs

# A checkpoint directory's own names: the writer makes them (trainer/worker/checkpoint/), the
# pod's side of the keeper and the keeper read them (trainer/keeper/): a checkpoint is a
# directory with its marker; the rest are the writer's passing files, never sent to a keeper.
CHECKPOINT_MARKER = "COMPLETE"  # written last: a checkpoint without it is incomplete
CHECKPOINT_TMP_PREFIX = ".tmp-ckpt-"  # a checkpoint being written, renamed into place whole
CHECKPOINT_NOTE_PREFIX = ".kubeddp-note-"  # a note being written
CHECKPOINT_ASIDE_PREFIX = ".kubeddp-aside-"  # a step's previous save while a new one replaces it
CHECKPOINT_LOCK_FILE = ".kubeddp-writer.lock"  # the one writer's lock
CHECKPOINT_PROBE = ".kubeddp-probe"  # written and removed: is the storage writable

# With --script/--module (a user's own program) only these config keys still apply (a section
# alone: all of its keys): launch's metrics endpoint, the SIGTERM grace, retries and
# diagnostics. launch refuses --set of any other key, the chart refuses those config values.
PROGRAM_CONFIG_KEYS = (
    "metrics", "checkpoint.preempt_grace_seconds", "checkpoint.readers", "retries", "diagnostics",
    "checkpoint.memory_snapshots", "checkpoint.memory_every_steps",
)  # fmt: skip

# Preemption: workers save within this many seconds of SIGTERM (checkpoint.preempt_grace_seconds'
# default); pods get more than that (tools/manifests/k8s_names.py TERMINATION_GRACE_PERIOD_SECONDS).
PREEMPT_GRACE_SECONDS = 60
# torchrun replaces this in a worker's arguments with the worker's local rank
LOCAL_RANK_MACRO = "${local_rank}"

# Environment variables kubeddp itself reads (those launch sets for its workers are the
# process contract's: trainer/process_contract.py)
ENV_CONFIG = "KUBEDDP_CONFIG"
ENV_CPU_NPROC = "KUBEDDP_CPU_NPROC"  # workers per CPU-only node when nproc is auto/cpu (default 1)
ENV_METRICS_PORT = "KUBEDDP_METRICS_PORT"
ENV_METRICS_BIND = "KUBEDDP_METRICS_BIND"
ENV_RDZV_WAIT_SECONDS = "KUBEDDP_RDZV_WAIT_SECONDS"
ENV_DRY_RUN_GPUS = "KUBEDDP_DRY_RUN_GPUS"  # --dry-run only: pretend this many GPUs are visible
ENV_SKIP_TORCH_CHECK = "KUBEDDP_SKIP_TORCH_CHECK"  # "1": launch on a torch outside the range
# The rendezvous kubeddp's own manifests set where no operator gives one (the Indexed Job and
# the Worker-only PyTorchJob); the node count is read for every kind that has no PET_NNODES.
ENV_MASTER_ADDR = "KUBEDDP_MASTER_ADDR"
ENV_MASTER_PORT = "KUBEDDP_MASTER_PORT"
ENV_NNODES = "KUBEDDP_NNODES"
ENV_NPROC_PER_NODE = "KUBEDDP_NPROC_PER_NODE"
# A Worker-only PyTorchJob: the node rank, from the pod's replica-index label (downward API)
ENV_NODE_RANK = "KUBEDDP_NODE_RANK"
# Rank 0 writes per-step wall-clock times here as JSON at the end of fit (tests/bench reads it)
ENV_SUMMARY_FILE = "KUBEDDP_SUMMARY_FILE"
# Metrics (trainer/worker/metrics.py, trainer/launcher/metrics_server.py)
ENV_METRICS_LINGER = "KUBEDDP_METRICS_LINGER_SECONDS"  # keep /metrics up after training ends
METRICS_DIR_PREFIX = "kubeddp-metrics-"  # fresh per launch, under SCRATCH_DIR
RUN_DIR_PREFIX = "kubeddp-run-"  # per launch, under SCRATCH_DIR: torchrun's log dir
DIAG_DIR_PREFIX = "kubeddp-diag-"  # per launch, under SCRATCH_DIR: the ranks' progress records
# The checkpoint keeper (trainer/keeper/server.py): the one pod that mounts a
# ReadWriteOnce claim and serves its files; training pods fill checkpoint.dir (an emptyDir)
# from it and send back what rank 0 writes (trainer/keeper/sync.py).
KEEPER_PORT = 9410
ENV_CHECKPOINT_KEEPER = "KUBEDDP_CHECKPOINT_KEEPER"  # http://HOST:PORT of the keeper
ENV_CHECKPOINT_SYNC_SECONDS = "KUBEDDP_CHECKPOINT_SYNC_SECONDS"  # how often files go back
# How often a pod waiting for its keeper says so (default 30 s; tests make it short).
ENV_CHECKPOINT_KEEPER_SAY_SECONDS = "KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS"
# The job's keeper secret: a file (a mounted Secret) whose path this names, in the keeper's pod
# and every training pod; every request is signed with it (trainer/keeper/auth.py).
ENV_CHECKPOINT_KEEPER_TOKEN_FILE = "KUBEDDP_CHECKPOINT_KEEPER_TOKEN_FILE"
# Where the manifests mount the job's Secret <job>-keeper-token (read-only, in the keeper's pod
# and every training pod) and the key that holds the secret: the file is DIR/KEY.
KEEPER_TOKEN_DIR = "/var/run/secrets/kubeddp-keeper"
KEEPER_TOKEN_KEY = "token"
# The pod's terminationGracePeriodSeconds, as the manifest gives it: the time a pod stopped by
# SIGTERM has for its save and its last send to the keeper (default below).
ENV_TERMINATION_GRACE_SECONDS = "KUBEDDP_TERMINATION_GRACE_SECONDS"
# The time a finished pod's last send is given beyond its bytes at the planned rate (default
# 30 s: trainer/keeper/sizing.py SEND_SLACK_SECONDS; tests make it short)
ENV_CHECKPOINT_KEEPER_SEND_SLACK_SECONDS = "KUBEDDP_CHECKPOINT_KEEPER_SEND_SLACK_SECONDS"
TERMINATION_GRACE_SECONDS = 2 * PREEMPT_GRACE_SECONDS  # the manifests' default
# Another block size (bytes, 1 MiB to 256 MiB; default 64 MiB) for the digests the checkpoint
# writer records and the keeper's transfers: smaller blocks make more of them run in parallel
ENV_CHECKPOINT_BLOCK_BYTES = "KUBEDDP_CHECKPOINT_BLOCK_BYTES"
# Tests only: the named point where this process SIGKILLs itself (trainer/fault_points.py)
ENV_TEST_KILL_AT = "KUBEDDP_TEST_KILL_AT"
# "1": a user's program runs in checkpoint.dir, so a relative `snapshot.pt` is kept
ENV_PROGRAM_IN_CHECKPOINT_DIR = "KUBEDDP_PROGRAM_IN_CHECKPOINT_DIR"
# How often launch posts a TrainJob's progress to Kubeflow Trainer (seconds; Trainer asks
# for >= 5): trainer/launcher/trainjob_status.py
ENV_TRAINER_STATUS_SECONDS = "KUBEDDP_TRAINER_STATUS_SECONDS"
# Where a node keeps its in-memory snapshots of the training state (trainer/worker/snapshot/):
# every manifest names the pod's, on its memory-backed /dev/shm volume (an emptyDir that lives
# as long as the pod); elsewhere it is one per checkpoint.dir and node on the host's /dev/shm
# (process_contract.snapshot_root).
ENV_SNAPSHOT_DIR = "KUBEDDP_SNAPSHOT_DIR"
POD_SNAPSHOT_DIR = "/dev/shm/kubeddp-snapshots"
# The KUBEDDP_* variables a user may set in a pod's env; every other KUBEDDP_* name is
# kubeddp's own (the chart's schema reserves them: tools/manifests/patterns.py RESERVED_ENV_NAME).
USER_ENV_SETTINGS = (
    ENV_CPU_NPROC, ENV_METRICS_PORT, ENV_METRICS_BIND, ENV_RDZV_WAIT_SECONDS, ENV_METRICS_LINGER,
    ENV_SKIP_TORCH_CHECK, "KUBEDDP_DEBUG", ENV_TRAINER_STATUS_SECONDS,
    ENV_CHECKPOINT_KEEPER_SAY_SECONDS,
)  # fmt: skip
# Where the kubelet reads a container's termination message (the one-line reason a pod ended:
# trainer/launcher/retry_budget.py write_termination_message), and the variable that names
# another file (tests, the emulated cluster)
TERMINATION_LOG = "/dev/termination-log"
ENV_TERMINATION_LOG = "KUBEDDP_TERMINATION_LOG"
# The pod's and node's names (downward API in every manifest) name a stalled or slow rank
ENV_POD_NAME = "POD_NAME"
ENV_NODE_NAME = "NODE_NAME"
DOWNWARD_ENV = {ENV_POD_NAME: "metadata.name", ENV_NODE_NAME: "spec.nodeName"}
# The fabric profile a job asked for (socket, efa, infiniband, roce, hostNetwork): set by the
# chart's network.fabric (docs/network.md); a worker that finds NCCL on TCP sockets although
# an RDMA fabric was asked for says why (trainer/worker/transport.py).
ENV_NETWORK_FABRIC = "KUBEDDP_NETWORK_FABRIC"
