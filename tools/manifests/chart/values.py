"""The Helm chart's values, defined once: path, schema, default, doc, `kubeddp render` flags.

`make chart` (tools/generate/chart_files.py) writes values.yaml, values.schema.json and the chart
README's values table from `VALUES`; `kubeddp render` builds its options from the flags below and
maps what the user gave onto these values (tools/manifests/chart/render_options.py). A flag sets
the value it is attached to, or the paths in `sets` through `convert` where it is not 1:1.
"""

from __future__ import annotations

from kubeddp.tools.manifests import k8s_names as names
from kubeddp.tools.manifests import patterns as P
from kubeddp.tools.manifests.chart import fabric
from kubeddp.tools.manifests.chart.value_types import (
    VOLUME_SOURCES,
    Flag,
    Section,
    Value,
    boolean,
    choice,
    data_volume,
    elastic_values,
    env_entries,
    env_from_values,
    env_name,
    env_secret_values,
    image_values,
    integer,
    k8s,
    k8s_list,
    label_map,
    nnodes_values,
    pairs,
    pull_secrets,
    resource,
    string_map,
    switch,
    text,
    volume_values,
)
from kubeddp.tools.manifests.kinds import AUTO, AUTO_ORDER, KINDS, MAX_JOB_NAME_LENGTH, OFFLINE_KIND
from kubeddp.tools.manifests.kinds.pytorchjob import CLEAN_POD_POLICIES, GANG_SCHEDULERS
from kubeddp.tools.manifests.kinds.trainjob import DEFAULT_RUNTIME, RUNTIME_KINDS
from kubeddp.trainer import constants as trainer
from kubeddp.trainer import exit_codes, storage_rules
from kubeddp.trainer.config import config_json_schema

PROGRAM_ARGS = "-- ARGS"  # the name of what follows `--` in render's errors

# What a null value means (null also means "not asked for": a TrainJob refuses these).
DEFAULT_RESTART_POLICY = "ExitCode"
DEFAULT_BACKOFF_LIMIT = 3
DEFAULT_CLEAN_POD_POLICY = "Running"  # after the job ends, stop agents left waiting in a barrier
DEFAULT_IMAGE_PULL_POLICY = "IfNotPresent"  # works with `kind load docker-image`
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
PLACEMENT_MODES = tuple(names.KUEUE_TOPOLOGY_ANNOTATIONS)  # required (the default), preferred
DEFAULT_CHECKPOINT_SIZE = "10Gi"  # the claim kubeddp creates unless told otherwise
CHECKPOINT_ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
CHECKPOINT_STORAGE = storage_rules.CLAIM_STORAGES  # checkpoints.storage; see its doc
DEFAULT_JOB_NAME = names.APP_NAME  # `kubeddp render` without --name
MANAGED_BY = ("Helm", "kubeddp")  # managedBy: who applies the objects
# A GPU pod's requests per GPU when `resources` names none: what the smallest GPU nodes have
# room for (4 vCPUs and 16 GiB per GPU, less the kubelet's and the daemons' share).
DEFAULT_CPU_PER_GPU = "2"
DEFAULT_MEMORY_PER_GPU = "8Gi"

GROUPS = (
    "job",
    "image and pods",
    "data and credentials",
    "scheduling",
    "trainer config and checkpoints",
    "monitoring",
)


# --- the values -------------------------------------------------------------------------------

JOB, POD, DATA, SCHEDULING, TRAINER, MONITORING = GROUPS
KIND_NAMES = tuple(kind.chart_kind for kind in KINDS.values())
RESTART_POLICIES = tuple(
    dict.fromkeys(policy for kind in KINDS.values() for policy in kind.restart_policies)
)
NPROC_WORDS = tuple(dict.fromkeys(word for kind in KINDS.values() for word in kind.nproc_words))
JOB_NAME = text(P.optional(P.DNS1035), maxLength=MAX_JOB_NAME_LENGTH)
OPTIONAL_SUBDOMAIN = text(P.optional(P.DNS1123_SUBDOMAIN), maxLength=253)
QUANTITY = text(P.QUANTITY)


def _or_null(schema: dict) -> dict:
    """A value whose null means "as the training pods have it"."""
    return {"anyOf": [{"type": "null"}, schema]}


def _kind_doc(cli: bool = False) -> str:
    kinds = "; ".join(
        f"{kind.name if cli else kind.chart_kind} ({kind.help})" for kind in KINDS.values()
    )
    if cli:
        return (
            f"the workload: {kinds}. Not given: render writes a {KINDS[OFFLINE_KIND].chart_kind} "
            "(it reads no cluster; the note on stderr says so), submit the kind the cluster "
            "serves, as the chart's kind auto"
        )
    order = ", then ".join(KINDS[name].chart_kind for name in AUTO_ORDER[:-1])
    return (
        f"the workload: {AUTO} (the kind the cluster serves: {order}, else "
        f"{KINDS[OFFLINE_KIND].chart_kind}; `helm template` sees no cluster and renders "
        f"{KINDS[OFFLINE_KIND].chart_kind} unless --api-versions names one, e.g. "
        f"--api-versions {KINDS[AUTO_ORDER[0]].resource.key}; `helm upgrade` keeps the kind of "
        f"the release's job); {kinds}"
    )


SECTIONS = (
    Section("image", "The training image (CUDA variant; `kubeddp:cpu` for CPU clusters)."),
    Section(
        "elastic",
        "Elastic training: torchrun's c10d rendezvous on <job>-worker-0; the job keeps running "
        "with minNodes..maxNodes pods and a restart resumes from the latest checkpoint.",
    ),
    Section(
        "pytorchJob",
        "A job that is not elastic: Workers only (worker-0 is rank 0), or a Master and Workers.",
    ),
    Section(
        "requestsPerGpu",
        "What a GPU pod requests per GPU of the cpu and memory that `resources` names neither as "
        "a request nor as a limit (a pod without requests is BestEffort: the first evicted when "
        "its node runs short). CPU pods (gpusPerNode 0) get nothing from here.",
    ),
    Section(
        "network",
        "The fast network between nodes, one profile per provider (docs/network-fabric.md).",
    ),
    Section("trainJob", "The training runtime the job runs on."),
    Section("istio", "Istio: a sidecar breaks the rendezvous."),
    Section(
        "memorySnapshots",
        "The training state kept in each pod's memory: a lost pod resumes from a peer's copy.",
    ),
    Section("kueue", "Kueue admits the whole job when its quota allows."),
    Section(
        "placement",
        "The job's pods under one network block (docs/network-fabric.md#placing-a-jobs-pods-"
        "together).",
    ),
    Section(
        "gang",
        "Gang scheduling: every pod starts together or none does. The Training "
        "Operator must run with --gang-scheduler-name set to the same scheduler; it creates the "
        "PodGroup.",
    ),
    Section("serviceAccount", "The pods' ServiceAccount."),
    Section(
        "checkpoints",
        "Checkpoints live at checkpoint.dir (default "
        f"{trainer.CHECKPOINT_DIR}), kept on a claim so that a recreated pod (every ExitCode "
        "retry, a preemption) resumes: a new claim (the default), an existing one, or, only "
        "when asked, an emptyDir that is lost with the pod. With more than one pod, a keeper pod "
        "holds the claim (ReadWriteOnce storage suffices) unless storage is mount.",
    ),
    Section(
        "keeper",
        "The checkpoint keeper (checkpoints.storage keeper): the pod that holds the claim and "
        "serves it to the job's pods, every request signed with the job's secret. null takes "
        "the training pods' setting.",
    ),
    Section(
        "trainer",
        "Your own training program instead of the built-in trainer: a torchrun-style script "
        "(`python PATH`) or module (`python -m NAME`) in the image, run on every worker with "
        "the same rendezvous, metrics and exit codes. `${local_rank}` in args becomes each "
        "worker's local rank.",
    ),
    Section("monitoring", "Prometheus and Grafana."),
    Section("monitoring.podMonitor", "A Prometheus Operator PodMonitor for the job's pods."),
    Section("monitoring.dashboard", "The Grafana dashboard."),
    Section(
        "monitoring.prometheusRule",
        "A Prometheus Operator PrometheusRule: alerts on a stalled rank, a straggler, a "
        "non-finite loss, restarts without progress, and a rank's GPU with XIDs, uncorrectable "
        "memory errors or slowed-down clocks from dcgm-exporter (docs/diagnostics.md).",
    ),
)

VALUES: tuple[Value, ...] = (
    Value(
        path="nameOverride",
        schema=JOB_NAME,
        default="",
        doc="the chart name used in names and labels",
        group=JOB,
    ),
    Value(
        path="fullnameOverride",
        schema=JOB_NAME,
        default="",
        doc="the job name: a DNS-1035 label (lower-case letters, digits and '-', starting with a "
        f"letter) of at most {MAX_JOB_NAME_LENGTH} characters; empty = the release's full name",
        group=JOB,
        flags=(Flag(("--name",), help=f"job name, a DNS-1035 label (default {DEFAULT_JOB_NAME})"),),
    ),
    Value(
        path="namespaceOverride",
        schema=text(P.optional(P.DNS1123_LABEL), maxLength=63),
        default="",
        doc="namespace written into every object; empty = none (the release's or kubectl's)",
        group=JOB,
        flags=(
            Flag(("-n", "--namespace"), help="namespace of the objects (default: none written)"),
        ),
    ),
    Value(
        path="managedBy",
        schema=choice(MANAGED_BY),
        default="Helm",
        doc="who applies the objects: Helm (its labels; a created claim is kept on uninstall), or "
        "kubeddp (`kubeddp render` sets it: plain manifests for kubectl and kubeddp submit)",
        group=JOB,
    ),
    Value(
        path="kind",
        schema=choice((AUTO, *KIND_NAMES)),
        default=AUTO,
        doc=_kind_doc(),
        group=JOB,
        flags=(Flag(("KIND",), read="kind", help=_kind_doc(cli=True)),),
    ),
    Value(
        path="image.repository",
        schema=text(P.IMAGE_REPOSITORY, minLength=1),
        default=names.IMAGE_REPOSITORY,
        doc="image repository",
        group=POD,
        flags=(
            Flag(
                ("--image",),
                metavar="REF",
                help="image reference repo[:port]/name[:tag][@digest] (default: "
                f"{names.IMAGE_REPOSITORY}:<kubeddp version>)",
                sets=("image.repository", "image.tag", "image.digest"),
                convert=image_values,
            ),
        ),
    ),
    Value(
        path="image.tag",
        schema=text(P.IMAGE_TAG),
        default="",
        doc="image tag; empty = the chart's appVersion (the kubeddp release)",
        group=POD,
    ),
    Value(
        path="image.digest",
        schema=text(P.IMAGE_DIGEST),
        default="",
        doc="image digest, e.g. sha256:...; set = the image is pulled by digest, not by tag",
        group=POD,
    ),
    Value(
        path="image.pullPolicy",
        schema=choice(PULL_POLICIES, nullable=True),
        default=None,
        doc=f"{', '.join(PULL_POLICIES)}; null = {DEFAULT_IMAGE_PULL_POLICY} (works with "
        "`kind load docker-image`)",
        group=POD,
        flags=(Flag(("--image-pull-policy",)),),
    ),
    Value(
        path="imagePullSecrets",
        schema=k8s_list("LocalObjectReference"),
        default=[],
        doc="Secrets for a private registry, e.g. [{name: regcred}]",
        group=DATA,
        flags=(
            Flag(
                ("--image-pull-secret",),
                read="list",
                metavar="NAME",
                help="Secret for a private registry (repeatable)",
                convert=pull_secrets,
            ),
        ),
    ),
    Value(
        path="nodes",
        schema=integer(minimum=1, nullable=True),
        default=None,
        doc="pods (nodes) in the job; null = 1, or elastic.maxNodes when elastic. "
        "PyTorchJob: nodes Workers (with pytorchJob.masterReplica: one Master and nodes-1 Workers)",
        group=JOB,
        flags=(
            Flag(
                ("--nnodes", "--nodes"),
                metavar="N|MIN:MAX",
                help="pods (nodes) in the job, as torchrun's --nnodes: N, or MIN:MAX for an "
                "elastic PyTorchJob (--elastic MIN:MAX); --nodes is the same option",
                sets=("nodes", "elastic.enabled", "elastic.minNodes", "elastic.maxNodes"),
                convert=nnodes_values,
            ),
        ),
    ),
    Value(
        path="nprocPerNode",
        schema={
            "oneOf": [
                {"type": "null"},
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": P.count_or(NPROC_WORDS).regex},
            ]
        },
        default=None,
        doc="worker processes per pod: a count, auto, cpu or gpu; null = gpusPerNode when > 0, "
        f"else auto (on a CPU node auto starts {trainer.ENV_CPU_NPROC} workers, default 1: set it "
        "under env)",
        group=JOB,
        flags=(Flag(("--nproc-per-node",)),),
    ),
    Value(
        path="gpusPerNode",
        schema=integer(minimum=0),
        default=0,
        doc=f"GPUs per pod ({names.GPU_RESOURCE}, requested and limited); 0 = a CPU job (gloo)",
        group=JOB,
        flags=(Flag(("--gpus-per-node",), read="int"),),
    ),
    Value(
        path="resources",
        schema=k8s("ResourceRequirements"),
        default={},
        doc='CPU and memory of each pod, e.g. {requests: {cpu: "8", memory: 64Gi}}; the GPU count '
        "is added, and a GPU pod requests requestsPerGpu of what this leaves out",
        group=JOB,
        flags=(
            Flag(("--resources",), read="yaml-map", metavar="YAML|FILE"),
            resource("requests", "cpu", "--cpu", "CPU request per pod, e.g. 8"),
            resource("requests", "memory", "--memory", "memory request per pod, e.g. 64Gi"),
            resource("limits", "cpu", "--cpu-limit", "CPU limit per pod"),
            resource("limits", "memory", "--memory-limit", "memory limit per pod"),
        ),
    ),
    Value(
        path="requestsPerGpu.cpu",
        schema=text(P.WHOLE_QUANTITY, nullable=True),
        default=DEFAULT_CPU_PER_GPU,
        doc="CPU requested per GPU (times gpusPerNode) unless resources names cpu; null or 0: "
        "none. The default fits the smallest GPU nodes (4 vCPUs per GPU: g4dn/g5.xlarge, "
        "g2-standard-4)",
        group=JOB,
        flags=(Flag(("--cpu-per-gpu",)),),
    ),
    Value(
        path="requestsPerGpu.memory",
        schema=text(P.WHOLE_QUANTITY, nullable=True),
        default=DEFAULT_MEMORY_PER_GPU,
        doc="memory requested per GPU (times gpusPerNode) unless resources names memory; null "
        "or 0: none. The default fits the smallest GPU nodes (16 GiB per GPU)",
        group=JOB,
        flags=(Flag(("--memory-per-gpu",)),),
    ),
    Value(
        path="shmSize",
        schema=QUANTITY,
        default="8Gi",
        doc="size of the memory-backed /dev/shm (a pod's default 64 MB is too small for NCCL and "
        "DataLoader workers)",
        group=JOB,
        flags=(Flag(("--shm-size",)),),
    ),
    Value(
        path="memorySnapshots.size",
        schema=text(P.optional(P.QUANTITY), nullable=True),
        default=None,
        doc="size of one in-memory snapshot of the training state (config "
        "checkpoint.memory_snapshots; docs/checkpoints.md): each pod keeps two in its /dev/shm, "
        "added to shmSize, its memory request and its limit (where set); a size that cannot hold "
        "the built-in trainer's state is refused. null: computed from its config (config.workload, "
        "config.train.optimizer); for your own program or a custom workload give it (about "
        "its checkpoint's size), else nothing is reserved; 0: reserve nothing",
        group=JOB,
        flags=(Flag(("--snapshot-size",), metavar="SIZE"),),
    ),
    Value(
        path="network.fabric",
        schema=choice(fabric.FABRICS),
        default=fabric.SOCKET,
        doc="the network between the nodes (docs/network-fabric.md): socket (TCP, adds nothing); "
        f"efa (AWS: {fabric.EFA_RESOURCE} devices); infiniband or roce (network.deviceResource "
        f"devices and {fabric.RDMA_CAPABILITY}: Pod Security privileged); hostNetwork (the node's "
        f"network: privileged). Any but socket sets {trainer.ENV_NETWORK_FABRIC}, so a worker that "
        "finds NCCL on sockets says why",
        group=POD,
        flags=(Flag(("--fabric",)),),
    ),
    Value(
        path="network.deviceResource",
        schema=text(P.optional(P.EXTENDED_RESOURCE), maxLength=317),
        default="",
        doc="the device plugin's resource each pod requests (requests and limits); empty = "
        f"{fabric.EFA_RESOURCE} for efa. infiniband and roce need it: rdma/ib (CoreWeave), "
        "rdma/<resourceName> of NVIDIA's RDMA shared device plugin, or your SR-IOV VF resource",
        group=POD,
        flags=(Flag(("--fabric-resource",)),),
    ),
    Value(
        path="network.devices",
        schema=integer(minimum=1, nullable=True),
        default=None,
        doc="devices per pod; null = for efa the adapters of network.instanceType ("
        + ", ".join(f"{name} {count}" for name, count in fabric.EFA_DEVICES.items())
        + "), else 1",
        group=POD,
        flags=(Flag(("--fabric-devices",), read="int"),),
    ),
    Value(
        path="network.instanceType",
        schema=text(P.optional(P.DNS1123_SUBDOMAIN), maxLength=253),
        default="",
        doc="the nodes' EC2 instance type, which gives efa its device count; a type the list "
        "under network.devices lacks needs network.devices (`aws ec2 describe-instance-types "
        "--query 'InstanceTypes[].NetworkInfo.EfaInfo'` says it)",
        group=POD,
        flags=(Flag(("--instance-type",)),),
    ),
    Value(
        path="podSecurityLevel",
        schema=choice(("", *fabric.POD_SECURITY_LEVELS)),
        default="",
        doc="the namespace's Pod Security level (its pod-security.kubernetes.io/enforce label), "
        "if you know it: a network.fabric whose pods need more is refused. Empty = not said; "
        "a fabric other than socket still names the level it needs",
        group=POD,
        flags=(Flag(("--pod-security",)),),
    ),
    Value(
        path="elastic.enabled",
        schema=boolean(),
        default=False,
        doc="an elastic PyTorchJob",
        group=JOB,
        flags=(
            Flag(
                ("--elastic",),
                metavar="MIN:MAX",
                help="elastic PyTorchJob of MIN..MAX pods (c10d rendezvous)",
                sets=("elastic.enabled", "elastic.minNodes", "elastic.maxNodes"),
                convert=elastic_values,
            ),
        ),
    ),
    Value(
        path="elastic.minNodes",
        schema=integer(minimum=1),
        default=1,
        doc="fewest pods the job runs with",
        group=JOB,
    ),
    Value(
        path="elastic.maxNodes", schema=integer(minimum=1), default=4, doc="most pods", group=JOB
    ),
    Value(
        path="elastic.rdzvId",
        schema=text(P.RDZV_ID, maxLength=63),
        default="",
        doc="rendezvous id (PET_RDZV_ID); empty = the job name",
        group=JOB,
        flags=(Flag(("--rdzv-id",)),),
    ),
    Value(
        path="elastic.maxRestarts",
        schema=integer(minimum=0),
        default=3,
        doc="restarts of the worker group before the job fails (PET_MAX_RESTARTS)",
        group=JOB,
        flags=(Flag(("--max-restarts",), read="int"),),
    ),
    Value(
        path="restartPolicy",
        schema=choice(RESTART_POLICIES, nullable=True),
        default=None,
        doc=f"what happens when a pod fails; null = {DEFAULT_RESTART_POLICY}: retry exit codes >= "
        f"{names.FIRST_RETRYABLE_EXIT_CODE} ({exit_codes.PREEMPTED} = preempted after "
        f"saving a checkpoint), fail on 1-{names.FIRST_RETRYABLE_EXIT_CODE - 1}. PyTorchJob "
        "ExitCode: training-operator v1.9 recreates the pod for every such code without end "
        "(backoffLimit does not count them; launch's retries.without_progress does). "
        "IndexedJob ExitCode: a podFailurePolicy (preemptions and a lost peer's codes not "
        "counted). OnFailure: the kubelet restarts the container in place, each restart "
        "counted against backoffLimit summed over all pods. "
        + "Policies by kind: "
        + "; ".join(
            f"{kind.chart_kind} {', '.join(kind.restart_policies)}"
            for kind in KINDS.values()
            if kind.restart_policies
        ),
        group=JOB,
        flags=(Flag(("--restart-policy",)),),
    ),
    Value(
        path="backoffLimit",
        schema=integer(minimum=0, nullable=True),
        default=None,
        doc=f"null = {DEFAULT_BACKOFF_LIMIT}. What it bounds differs by kind. PyTorchJob "
        "(training-operator v1.9): restarts of Running pods only; with restartPolicy ExitCode "
        "it never bounds the recreations of pods that exit >= 128 (0 fails the job at the "
        "first failure). IndexedJob: failed pods summed over all pods, preemptions and a lost "
        "peer's exit codes not counted. TrainJob (with trainJob.ownRuntime): the Job's "
        "backoffLimit (counted pod failures summed over the pods) and the JobSet's "
        "failurePolicy.maxRestarts (restarts of the whole gang). On every kind launch's own "
        "budget, `retries.without_progress`, ends a job whose restarts make no progress",
        group=JOB,
        flags=(Flag(("--backoff-limit",), read="int"),),
    ),
    Value(
        path="ttlSecondsAfterFinished",
        schema=integer(minimum=0, nullable=True),
        default=None,
        doc="delete the finished job after this many seconds; null = keep it",
        group=JOB,
        flags=(Flag(("--ttl-seconds-after-finished",), read="int"),),
    ),
    Value(
        path="timeLimit",
        schema={
            "anyOf": [
                {"type": "null"},
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": P.TIME_LIMIT.regex, "minLength": 1},
            ]
        },
        default=None,
        doc="the longest the job may run: a duration (90m, 12h, 1h30m) or seconds; null = no "
        "limit. The operator counts from the job's start (creation; again after a resume from "
        "suspension, e.g. Kueue's admission), time waiting for nodes and retries included; once "
        "past it stops every pod and fails the job (reason DeadlineExceeded), retries left or "
        "not. Written as each kind's own field: PyTorchJob runPolicy.activeDeadlineSeconds; "
        "IndexedJob spec.activeDeadlineSeconds; TrainJob spec.activeDeadlineSeconds (Trainer "
        "v2.2 and later; it is immutable)",
        group=JOB,
        flags=(Flag(("--time-limit",), metavar="DURATION"),),
    ),
    Value(
        path="cleanPodPolicy",
        schema=choice(CLEAN_POD_POLICIES, nullable=True),
        default=None,
        doc=f"pods deleted when the job ends: {', '.join(CLEAN_POD_POLICIES)}; null = "
        f"{DEFAULT_CLEAN_POD_POLICY} (stops agents left waiting in torchrun's exit barrier)",
        group=JOB,
        flags=(Flag(("--clean-pod-policy",)),),
    ),
    Value(
        path="terminationGracePeriodSeconds",
        schema=integer(minimum=0, nullable=True),
        default=None,
        doc="seconds between SIGTERM and SIGKILL; workers save a checkpoint within "
        "checkpoint.preempt_grace_seconds of SIGTERM. null = "
        f"{names.TERMINATION_GRACE_PERIOD_SECONDS}, or behind a checkpoint keeper the save plus "
        "the send of one checkpoint at 25 MB/s (the largest checkpoint the claim holds: "
        "checkpoints.size / (checkpoint.keep + 1))",
        group=JOB,
        flags=(Flag(("--termination-grace-period-seconds",), read="int"),),
    ),
    Value(
        path="pytorchJob.masterReplica",
        schema=boolean(),
        default=False,
        doc="a Master replica (rank 0) and nodes-1 Workers instead of nodes Workers. "
        "training-operator v1.9 then adds its init-pytorch container (alpine, no "
        "securityContext) to every Worker: Pod Security `restricted` rejects those pods and an "
        "air-gapped cluster cannot pull the image, unless the operator runs with "
        "--pytorch-init-container-image / --pytorch-init-container-template-file",
        group=JOB,
        flags=(switch("--master-replica"),),
    ),
    Value(
        path="trainJob.runtimeName",
        schema=text(P.DNS1123_SUBDOMAIN, maxLength=253),
        default=DEFAULT_RUNTIME,
        doc="the training runtime's name (with trainJob.ownRuntime false)",
        group=JOB,
        flags=(Flag(("--runtime-name",)),),
    ),
    Value(
        path="trainJob.ownRuntime",
        schema=boolean(),
        default=True,
        doc="render a TrainingRuntime named after the job and run on it: the torch runtime with "
        "a JobSet failurePolicy (restart the gang when its Job fails, at most backoffLimit "
        "times; fail at once on exit codes 1-127) and a Job whose pods run restartPolicy Never "
        "under a pod failure policy that does not count a preemption or a lost peer's exit. "
        "false: trainJob.runtimeKind/runtimeName as installed (Trainer's torch-distributed: "
        "pods restart OnFailure, the Job's backoffLimit 6 counts restarts summed over all "
        "pods, and the first failed Job fails the TrainJob)",
        group=JOB,
        flags=(switch("--own-runtime"),),
    ),
    Value(
        path="trainJob.runtimeKind",
        schema=choice(RUNTIME_KINDS),
        default=RUNTIME_KINDS[0],
        doc=" or ".join(RUNTIME_KINDS) + " (namespaced)",
        group=JOB,
        flags=(Flag(("--runtime-kind",)),),
    ),
    Value(
        path="env",
        schema={**string_map(), "propertyNames": env_name(trainer.USER_ENV_SETTINGS)},
        default={},
        doc='environment of the training container, NAME: "value" (strings: quote numbers, or use '
        "--set-string with helm). Not the names kubeddp, torchrun or the operator set "
        f"(KUBEDDP_* but {', '.join(trainer.USER_ENV_SETTINGS)}; PET_*, TORCHELASTIC_*, "
        "MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, LOCAL_WORLD_SIZE, PATH)",
        group=POD,
        flags=(pairs("--env"),),
    ),
    Value(
        path="extraEnv",
        schema=env_entries(trainer.USER_ENV_SETTINGS),
        default=[],
        doc="more env entries as Kubernetes EnvVar objects (valueFrom a Secret...); the same names "
        "as `env` are refused, and each name once",
        group=DATA,
        flags=(
            Flag(("--extra-env",), read="yaml-list", metavar="YAML|FILE"),
            Flag(
                ("--env-secret",),
                read="list",
                metavar="VAR=SECRET:KEY",
                help="environment variable VAR from key KEY of Secret SECRET (repeatable)",
                convert=env_secret_values,
            ),
        ),
    ),
    Value(
        path="envFrom",
        schema=k8s_list("EnvFromSource"),
        default=[],
        doc="every key of these Secrets/ConfigMaps as environment variables, e.g. [{secretRef: "
        "{name: s3-credentials}}]",
        group=DATA,
        flags=(
            Flag(
                ("--env-from",),
                read="list",
                metavar="secret:NAME|configmap:NAME",
                help="every key of this Secret or ConfigMap as an env variable (repeatable)",
                convert=env_from_values,
            ),
        ),
    ),
    Value(
        path="volumes",
        schema={
            "type": "array",
            "items": data_volume(
                P.DNS1123_LABEL,
                names.KUBEDDP_VOLUMES,
                P.paths_and_parents(names.RESERVED_MOUNT_PATHS),
            ),
        },
        default=[],
        doc="more volumes of the training container, each a Kubernetes volume (a name and one "
        f"source: {', '.join(VOLUME_SOURCES)}) with its mountPath, and readOnly/subPath; e.g. "
        "[{name: data, mountPath: /data, readOnly: true, persistentVolumeClaim: {claimName: "
        "datasets}}]. A mount may not hide kubeddp's paths or the image's (/dev/shm, "
        f"{trainer.CHECKPOINT_DIR}, {names.CONFIG_DIR}, /tmp, /opt/venv...)",
        group=DATA,
        flags=(
            Flag(
                ("--volume",),
                read="list",
                metavar="TYPE:NAME:PATH[:ro]",
                help="mount PersistentVolumeClaim (TYPE claim), ConfigMap (configmap) or Secret "
                "(secret) NAME at PATH, read-only with :ro (repeatable)",
                convert=volume_values,
            ),
            Flag(
                ("--volumes",),
                read="yaml-list",
                metavar="YAML|FILE",
                help="volumes in the chart's form (any source, e.g. csi or ephemeral)",
            ),
        ),
    ),
    Value(
        path="podAnnotations",
        schema=string_map(P.QUALIFIED_NAME),
        default={},
        doc="extra annotations of the training pods",
        group=POD,
        flags=(pairs("--pod-annotation"),),
    ),
    Value(
        path="podLabels",
        schema=label_map(),
        default={},
        doc="extra labels of the training pods",
        group=POD,
        flags=(pairs("--pod-label"),),
    ),
    Value(
        path="nodeSelector",
        schema=label_map(),  # label keys and values, as the API server checks them
        default={},
        doc="node selector of the pods",
        group=SCHEDULING,
        flags=(pairs("--node-selector"),),
    ),
    Value(
        path="tolerations",
        schema=k8s_list("Toleration"),
        default=[],
        doc="tolerations of the pods",
        group=SCHEDULING,
        flags=(Flag(("--tolerations",), read="yaml-list", metavar="YAML|FILE"),),
    ),
    Value(
        path="affinity",
        schema=k8s("Affinity"),
        default={},
        doc="affinity of the pods",
        group=SCHEDULING,
        flags=(Flag(("--affinity",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        path="priorityClassName",
        schema=text(P.optional(P.DNS1123_SUBDOMAIN)),
        default="",
        doc="PriorityClass of the pods",
        group=SCHEDULING,
        flags=(Flag(("--priority-class",)),),
    ),
    Value(
        path="istio.optOut",
        schema=boolean(),
        default=True,
        doc=f'annotate pods {names.ISTIO_INJECT_ANNOTATION}: "false"',
        group=SCHEDULING,
        flags=(switch("--istio-opt-out"),),
    ),
    Value(
        path="kueue.queueName",
        schema=text(P.optional(P.DNS1123_LABEL), maxLength=63),
        default="",
        doc=f"admit the job through this Kueue LocalQueue (label {names.KUEUE_QUEUE_LABEL})",
        group=SCHEDULING,
        flags=(Flag(("--queue",)),),
    ),
    Value(
        path="placement.topologyKey",
        schema=text(P.optional(P.QUALIFIED_NAME), maxLength=317),
        default="",
        doc="place the job's pods in one domain of this node label (a network block, e.g. "
        "cloud.google.com/gce-topology-block, or topology.kubernetes.io/zone): with "
        "kueue.queueName, Kueue's Topology-Aware Scheduling annotation on the pods (the "
        "queue's ResourceFlavor must name a Topology with this level); otherwise a pod "
        "affinity to the job's other training pods on this key. Empty = no placement",
        group=SCHEDULING,
        flags=(Flag(("--topology-key",)),),
    ),
    Value(
        path="placement.mode",
        schema=choice(PLACEMENT_MODES),
        default=PLACEMENT_MODES[0],
        doc="required: every pod in one domain, or the pods wait (Kueue: "
        f"{names.KUEUE_TOPOLOGY_ANNOTATIONS['required']}); preferred: one domain when it has "
        f"room, else spread (Kueue: {names.KUEUE_TOPOLOGY_ANNOTATIONS['preferred']})",
        group=SCHEDULING,
        flags=(Flag(("--topology-mode",)),),
    ),
    Value(
        path="gang.scheduler",
        schema=choice(("", *GANG_SCHEDULERS)),
        default="",
        doc='"" (off), ' + " or ".join(GANG_SCHEDULERS) + " (pods get its schedulerName)",
        group=SCHEDULING,
        flags=(Flag(("--gang",)),),
    ),
    Value(
        path="gang.queue",
        schema=text(P.optional(P.DNS1123_LABEL)),
        default="",
        doc="Volcano queue of the PodGroup; empty = the scheduler's default",
        group=SCHEDULING,
        flags=(Flag(("--gang-queue",)),),
    ),
    Value(
        path="podSecurityContext",
        schema=k8s("PodSecurityContext"),
        default=names.POD_SECURITY_CONTEXT,
        doc=f"the pods' security context: the restricted Pod Security Standard, uid/gid "
        f"{names.IMAGE_UID} (the image's user)",
        group=POD,
        flags=(Flag(("--pod-security-context",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        path="securityContext",
        schema=k8s("SecurityContext"),
        default=names.CONTAINER_SECURITY_CONTEXT,
        doc="the training container's security context: restricted, read-only root filesystem "
        "(/tmp, /dev/shm and /checkpoints are volumes)",
        group=POD,
        flags=(Flag(("--security-context",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        path="serviceAccount.create",
        schema=boolean(),
        default=False,
        doc="create a ServiceAccount for the pods",
        group=POD,
        flags=(switch("--create-service-account"),),
    ),
    Value(
        path="serviceAccount.name",
        schema=OPTIONAL_SUBDOMAIN,
        default="",
        doc="the account to create or use; empty = the full name when created, else none (the "
        "namespace default, token not mounted). A named account's token is mounted",
        group=POD,
        flags=(Flag(("--service-account",)),),
    ),
    Value(
        path="serviceAccount.annotations",
        schema=string_map(P.QUALIFIED_NAME),
        default={},
        doc="annotations of the created account (e.g. cloud workload identity)",
        group=POD,
        flags=(pairs("--service-account-annotation"),),
    ),
    Value(
        path="config",
        schema=config_json_schema(),
        default={},
        doc="the trainer config file (sections workload, train, ddp, checkpoint, metrics; see "
        f"docs/config-reference.md), shipped in a ConfigMap at {trainer.CONFIG_FILE}. "
        f"checkpoint.dir defaults to {trainer.CHECKPOINT_DIR}. Example: {{train: {{epochs: 3}}}}",
        group=TRAINER,
        flags=(
            Flag(
                ("--config",),
                read="config-file",
                metavar="FILE",
                help="trainer config YAML (shipped as ConfigMap)",
            ),
            Flag(
                ("--set",),
                read="config-set",
                metavar="SECTION.KEY=VALUE",
                help="trainer config setting, on top of --config (repeatable)",
            ),
        ),
    ),
    Value(
        path="trainer.script",
        schema=text(maxLength=4096),
        default="",
        doc="your training script: a Python file in the image (an absolute path, e.g. "
        "/app/train.py); empty = the built-in trainer",
        group=TRAINER,
        flags=(Flag(("--script",), metavar="PATH", help="run this Python file of the image"),),
    ),
    Value(
        path="trainer.module",
        schema=text(P.optional(P.PYTHON_MODULE), maxLength=1024),
        default="",
        doc="your training module (`python -m NAME`), installed in the image; empty = the built-in "
        "trainer",
        group=TRAINER,
        flags=(
            Flag(("--module",), metavar="NAME", help="run this module of the image (python -m)"),
        ),
    ),
    Value(
        path="trainer.spawnsWorkers",
        schema={"type": ["boolean", "null"]},
        default=None,
        doc="your script starts its own workers (mp.spawn, mp.Process): launch runs it once, "
        "on one node only; null = detected in the script",
        group=TRAINER,
        flags=(switch("--spawns-workers"),),
    ),
    Value(
        path="trainer.args",
        schema={"type": "array", "items": {"type": "string"}},
        default=[],
        doc="the arguments of your script or module, as written (`kubeddp render ... -- ARGS`)",
        group=TRAINER,
        flags=(
            Flag(
                (PROGRAM_ARGS,),
                read="program-args",
                help="what follows -- on the command line: your program's arguments",
            ),
        ),
    ),
    Value(
        path="checkpoints.existingClaim",
        schema=OPTIONAL_SUBDOMAIN,
        default="",
        doc="mount this existing PersistentVolumeClaim instead of creating one",
        group=TRAINER,
        flags=(Flag(("--checkpoint-pvc",), metavar="CLAIM"),),
    ),
    Value(
        path="checkpoints.size",
        schema=text(P.optional(P.QUANTITY), nullable=True),
        default=None,
        doc="size of the claim <job>-checkpoints that is created; "
        f"null = {DEFAULT_CHECKPOINT_SIZE}",
        group=TRAINER,
        flags=(Flag(("--checkpoint-size",), metavar="SIZE"),),
    ),
    Value(
        path="checkpoints.storageClassName",
        schema=text(P.optional(P.DNS1123_SUBDOMAIN)),
        default="",
        doc="StorageClass of the created claim; empty = the cluster's default",
        group=TRAINER,
        flags=(Flag(("--storage-class",)),),
    ),
    Value(
        path="checkpoints.accessMode",
        schema=choice(CHECKPOINT_ACCESS_MODES, nullable=True),
        default=None,
        doc="access mode of the created claim; null = ReadWriteOnce, or ReadWriteMany when "
        "storage is mount and the job has more than one pod. ReadWriteOnce and "
        "ReadWriteOncePod with several pods need storage keeper (the default)",
        group=TRAINER,
        flags=(Flag(("--checkpoint-access-mode",)),),
    ),
    Value(
        path="checkpoints.storage",
        schema=choice(CHECKPOINT_STORAGE, nullable=True),
        default=None,
        doc="how the training pods reach the claim. keeper: one small pod (<job>-keeper, the same "
        "image) mounts it and serves it; each training pod keeps checkpoint.dir on an emptyDir, "
        "filled from the keeper before its workers start, and sends back what rank 0 writes: "
        "works with ReadWriteOnce storage, the default of EKS, GKE, AKS and kind. mount: every "
        "pod mounts the claim at checkpoint.dir (more than one pod: ReadWriteMany storage). "
        "null = keeper when the job has more than one pod, unless accessMode is ReadWriteMany; "
        "else mount",
        group=TRAINER,
        flags=(Flag(("--checkpoint-storage",)),),
    ),
    Value(
        path="checkpoints.lostOnRetry",
        schema=boolean(),
        default=False,
        doc=f"put {trainer.CHECKPOINT_DIR} on an emptyDir instead of a claim: checkpoints are lost "
        "with the pod, so every retry (a recreated pod) and every preemption starts training "
        "from scratch",
        group=TRAINER,
        flags=(switch("--checkpoints-lost-on-retry"),),
    ),
    Value(
        path="keeper.existingSecret",
        schema=OPTIONAL_SUBDOMAIN,
        default="",
        doc=f"a Secret you made whose key {trainer.KEEPER_TOKEN_KEY} holds the job's keeper secret "
        "(16 to 4096 bytes); empty = the chart makes <job>-keeper-token with 32 random bytes "
        "(helm upgrade keeps its value). Give it to re-render a running job for kubectl apply "
        "(e.g. <job>-keeper-token): a new value is refused by the immutable Secret",
        group=TRAINER,
        flags=(Flag(("--keeper-secret",), metavar="SECRET"),),
    ),
    Value(
        path="keeper.networkPolicy",
        schema=boolean(),
        default=True,
        doc="a NetworkPolicy <job>-keeper that admits only the job's training pods to the "
        "keeper's port, where the cluster's network plugin enforces NetworkPolicy (the secret "
        "protects the checkpoints either way)",
        group=TRAINER,
        flags=(switch("--keeper-network-policy"),),
    ),
    Value(
        path="keeper.nodeSelector",
        schema=_or_null(label_map()),
        default=None,
        doc="node selector of the keeper pod; null = the job's nodeSelector",
        group=SCHEDULING,
        flags=(Flag(("--keeper-node-selector",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        path="keeper.tolerations",
        schema=_or_null(k8s_list("Toleration")),
        default=None,
        doc="tolerations of the keeper pod; null = the job's tolerations",
        group=SCHEDULING,
        flags=(Flag(("--keeper-tolerations",), read="yaml-list", metavar="YAML|FILE"),),
    ),
    Value(
        path="keeper.affinity",
        schema=_or_null(k8s("Affinity")),
        default=None,
        doc="affinity of the keeper pod; null = the job's affinity",
        group=SCHEDULING,
        flags=(Flag(("--keeper-affinity",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        path="keeper.priorityClassName",
        schema=text(P.optional(P.DNS1123_SUBDOMAIN), nullable=True),
        default=None,
        doc="PriorityClass of the keeper pod; null = the job's priorityClassName",
        group=SCHEDULING,
        flags=(Flag(("--keeper-priority-class",)),),
    ),
    Value(
        path="keeper.resources",
        schema=_or_null(k8s("ResourceRequirements")),
        default=None,
        doc="requests and limits of the keeper's container; null = "
        "trainer/keeper/sizing.py's (CPU to hash what it receives at 200 MB/s, memory for "
        "its buffers; limits set, so a ResourceQuota on limits admits it)",
        group=TRAINER,
        flags=(Flag(("--keeper-resources",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        path="monitoring.podMonitor.enabled",
        schema=boolean(),
        default=False,
        doc=f"create a PodMonitor scraping {names.METRICS_PATH} on port {names.METRICS_PORT_NAME} "
        f"({trainer.METRICS_PORT}) of every pod of the job",
        group=MONITORING,
        flags=(switch("--podmonitor"),),
    ),
    Value(
        path="monitoring.podMonitor.labels",
        schema=label_map(),
        default={},
        doc="extra labels, e.g. {release: kube-prometheus-stack} to match podMonitorSelector",
        group=MONITORING,
        flags=(pairs("--podmonitor-label"),),
    ),
    Value(
        path="monitoring.podMonitor.interval",
        schema=text(P.DURATION),
        default="",
        doc="scrape interval, e.g. 15s; empty = Prometheus' default",
        group=MONITORING,
        flags=(Flag(("--podmonitor-interval",)),),
    ),
    Value(
        path="monitoring.dashboard.enabled",
        schema=boolean(),
        default=False,
        doc="ship the Grafana dashboard (dashboards/*.json) in a ConfigMap labelled "
        'grafana_dashboard: "1" for the Grafana sidecar',
        group=MONITORING,
        flags=(switch("--dashboard"),),
    ),
    Value(
        path="monitoring.dashboard.labels",
        schema=label_map(),
        default={},
        doc="extra labels of the dashboard ConfigMap",
        group=MONITORING,
        flags=(pairs("--dashboard-label"),),
    ),
    Value(
        path="monitoring.prometheusRule.enabled",
        schema=boolean(),
        default=False,
        doc="create a PrometheusRule with the job's alerts (needs the PodMonitor or another "
        "scrape)",
        group=MONITORING,
    ),
    Value(
        path="monitoring.prometheusRule.labels",
        schema=label_map(),
        default={},
        doc="extra labels, e.g. {release: kube-prometheus-stack} to match ruleSelector",
        group=MONITORING,
    ),
    Value(
        path="monitoring.prometheusRule.noProgressSeconds",
        schema=integer(minimum=1),
        default=300,
        doc="a rank with no progress for this long is stalled (alert KubeddpRankStalled)",
        group=MONITORING,
    ),
)

BY_PATH = {value.path: value for value in VALUES}
FLAGS: tuple[tuple[Flag, Value], ...] = tuple((f, v) for v in VALUES for f in v.flags)
# Values Helm or render itself owns: no flag sets them.
NOT_FLAGS = {
    "nameOverride": "Helm's naming; render names the job with --name",
    "managedBy": "render always writes kubeddp",
    "monitoring.prometheusRule.enabled": "alert rules come with the Helm chart only",
    "monitoring.prometheusRule.labels": "alert rules come with the Helm chart only",
    "monitoring.prometheusRule.noProgressSeconds": "alert rules come with the Helm chart only",
}


def flag_sets(flag: Flag, value: Value) -> tuple[str, ...]:
    return flag.sets or (value.path,)


def _static_options() -> dict[str, str]:
    options: dict[str, str] = {}
    for flag, value in FLAGS:
        for target in flag_sets(flag, value):
            options.setdefault(target, flag.name)
    return options


def option_for(path: str, provenance: dict[str, str] | None = None) -> str:
    """The render option that sets a value path, e.g. --cpu for resources.requests.cpu:
    what this run used (`provenance`: path -> option) first, then the option made for it."""
    parts = path.split(".")
    for candidates in (provenance or {}, _static_options()):
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in candidates:
                return candidates[prefix]
            inside = [
                option for target, option in candidates.items() if target.startswith(prefix + ".")
            ]
            if inside:  # a value of which one option sets a part (elastic -> --elastic)
                return inside[0]
    return path
