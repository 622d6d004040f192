"""The Helm chart's values, defined once: path, schema, default, doc, `kubeddp render` flags.

`make chart` (tools/gen_chart.py) writes values.yaml, values.schema.json and the chart README's
values table from `VALUES`; `kubeddp render` builds its options from the flags below and maps
what the user gave onto these values (tools/render_options.py). A flag sets the value it is
attached to, or the paths in `sets` through `convert` where it is not 1:1.
"""

from __future__ import annotations

from kubeddp.tools import k8s_names as names
from kubeddp.tools import patterns as P
from kubeddp.tools.chart_value_types import (
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
    pairs,
    pull_secrets,
    resource,
    string_map,
    switch,
    text,
    volume_values,
)
from kubeddp.tools.kinds import KINDS, MAX_JOB_NAME_LENGTH
from kubeddp.tools.kinds.pytorchjob import CLEAN_POD_POLICIES, GANG_SCHEDULERS
from kubeddp.tools.kinds.trainjob import DEFAULT_RUNTIME, RUNTIME_KINDS
from kubeddp.trainer import constants as trainer
from kubeddp.trainer import exit_codes
from kubeddp.trainer.config import config_json_schema

PROGRAM_ARGS = "-- ARGS"  # the name of what follows `--` in render's errors

# What a null value means (null also means "not asked for": a TrainJob refuses these).
DEFAULT_RESTART_POLICY = "ExitCode"
DEFAULT_BACKOFF_LIMIT = 3
DEFAULT_CLEAN_POD_POLICY = "Running"  # after the job ends, stop agents left waiting in a barrier
DEFAULT_IMAGE_PULL_POLICY = "IfNotPresent"  # works with `kind load docker-image`
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
DEFAULT_CHECKPOINT_SIZE = "10Gi"  # the claim kubeddp creates unless told otherwise
CHECKPOINT_ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
CHECKPOINT_STORAGE = ("keeper", "mount")  # checkpoints.storage; see its doc
DEFAULT_JOB_NAME = names.APP_NAME  # `kubeddp render` without --name
MANAGED_BY = ("Helm", "kubeddp")  # managedBy: who applies the objects

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


def _kind_doc(cli: bool = False) -> str:
    return "the workload: " + "; ".join(
        f"{kind.name if cli else kind.chart_kind} ({kind.help})" for kind in KINDS.values()
    )


SECTIONS = (
    Section("image", "The training image (CUDA variant; `kubeddp:cpu` for CPU clusters)."),
    Section(
        "elastic",
        "Elastic PyTorchJob: torchrun's c10d rendezvous on <job>-worker-0; the job keeps running "
        "with minNodes..maxNodes pods and a restart resumes from the latest checkpoint.",
    ),
    Section(
        "pytorchJob",
        "PyTorchJob that is not elastic: Workers only (worker-0 is rank 0), or a Master and "
        "Workers.",
    ),
    Section("trainJob", "TrainJob: the training runtime it runs on."),
    Section("istio", "Istio: a sidecar breaks the rendezvous."),
    Section("kueue", "Kueue admits the whole job when its quota allows."),
    Section(
        "gang",
        "Gang scheduling (PyTorchJob): every pod starts together or none does. The Training "
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
        "non-finite loss and restarts without progress (docs/diagnostics.md).",
    ),
)

VALUES: tuple[Value, ...] = (
    Value("nameOverride", JOB_NAME, "", "the chart name used in names and labels", JOB),
    Value(
        "fullnameOverride",
        JOB_NAME,
        "",
        "the job name: a DNS-1035 label (lower-case letters, digits and '-', starting with a "
        f"letter) of at most {MAX_JOB_NAME_LENGTH} characters; empty = the release's full name",
        JOB,
        (Flag(("--name",), help=f"job name, a DNS-1035 label (default {DEFAULT_JOB_NAME})"),),
    ),
    Value(
        "namespaceOverride",
        text(P.optional(P.DNS1123_LABEL), maxLength=63),
        "",
        "namespace written into every object; empty = none (the release's or kubectl's)",
        JOB,
        (Flag(("-n", "--namespace"), help="namespace of the objects (default: none written)"),),
    ),
    Value(
        "managedBy",
        choice(MANAGED_BY),
        "Helm",
        "who applies the objects: Helm (its labels; a created claim is kept on uninstall), or "
        "kubeddp (`kubeddp render` sets it: plain manifests for kubectl and kubeddp submit)",
        JOB,
    ),
    Value(
        "kind",
        choice(KIND_NAMES),
        KIND_NAMES[0],
        _kind_doc(),
        JOB,
        (Flag(("KIND",), read="kind", help=_kind_doc(cli=True)),),
    ),
    Value(
        "image.repository",
        text(P.IMAGE_REPOSITORY, minLength=1),
        names.IMAGE_REPOSITORY,
        "image repository",
        POD,
        (
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
        "image.tag",
        text(P.IMAGE_TAG),
        "",
        "image tag; empty = the chart's appVersion (the kubeddp release)",
        POD,
    ),
    Value(
        "image.digest",
        text(P.IMAGE_DIGEST),
        "",
        "image digest, e.g. sha256:...; set = the image is pulled by digest, not by tag",
        POD,
    ),
    Value(
        "image.pullPolicy",
        choice(PULL_POLICIES, nullable=True),
        None,
        f"{', '.join(PULL_POLICIES)}; null = {DEFAULT_IMAGE_PULL_POLICY} (works with `kind load "
        "docker-image`). TrainJob: must stay null (Trainer v2.3 has no field for it; the "
        "runtime's container decides)",
        POD,
        (Flag(("--image-pull-policy",)),),
    ),
    Value(
        "imagePullSecrets",
        k8s_list("LocalObjectReference"),
        [],
        "Secrets for a private registry, e.g. [{name: regcred}]",
        DATA,
        (
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
        "nodes",
        integer(minimum=1, nullable=True),
        None,
        "pods (nodes) in the job; null = 1, or elastic.maxNodes when elastic. PyTorchJob: nodes "
        "Workers (with pytorchJob.masterReplica: one Master and nodes-1 Workers)",
        JOB,
        (Flag(("--nodes",), read="int"),),
    ),
    Value(
        "nprocPerNode",
        {
            "oneOf": [
                {"type": "null"},
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": P.count_or(NPROC_WORDS).regex},
            ]
        },
        None,
        "worker processes per pod: a count, auto, cpu or gpu; null = gpusPerNode when > 0, else "
        f"auto (on a CPU node auto starts {trainer.ENV_CPU_NPROC} workers, default 1: set it "
        "under env)",
        JOB,
        (Flag(("--nproc-per-node",)),),
    ),
    Value(
        "gpusPerNode",
        integer(minimum=0),
        0,
        f"GPUs per pod ({names.GPU_RESOURCE}, requested and limited); 0 = a CPU job (gloo)",
        JOB,
        (Flag(("--gpus-per-node",), read="int"),),
    ),
    Value(
        "resources",
        k8s("ResourceRequirements"),
        {},
        'CPU and memory of each pod, e.g. {requests: {cpu: "8", memory: 64Gi}}; the GPU count '
        "is added",
        JOB,
        (
            Flag(("--resources",), read="yaml-map", metavar="YAML|FILE"),
            resource("requests", "cpu", "--cpu", "CPU request per pod, e.g. 8"),
            resource("requests", "memory", "--memory", "memory request per pod, e.g. 64Gi"),
            resource("limits", "cpu", "--cpu-limit", "CPU limit per pod"),
            resource("limits", "memory", "--memory-limit", "memory limit per pod"),
        ),
    ),
    Value(
        "shmSize",
        QUANTITY,
        "8Gi",
        "size of the memory-backed /dev/shm (a pod's default 64 MB is too small for NCCL and "
        "DataLoader workers)",
        JOB,
        (Flag(("--shm-size",)),),
    ),
    Value(
        "elastic.enabled",
        boolean(),
        False,
        "an elastic PyTorchJob",
        JOB,
        (
            Flag(
                ("--elastic",),
                metavar="MIN:MAX",
                help="elastic PyTorchJob of MIN..MAX pods (c10d rendezvous)",
                sets=("elastic.enabled", "elastic.minNodes", "elastic.maxNodes"),
                convert=elastic_values,
            ),
        ),
    ),
    Value("elastic.minNodes", integer(minimum=1), 1, "fewest pods the job runs with", JOB),
    Value("elastic.maxNodes", integer(minimum=1), 4, "most pods", JOB),
    Value(
        "elastic.rdzvId",
        text(P.RDZV_ID, maxLength=63),
        "",
        "rendezvous id (PET_RDZV_ID); empty = the job name",
        JOB,
        (Flag(("--rdzv-id",)),),
    ),
    Value(
        "elastic.maxRestarts",
        integer(minimum=0),
        3,
        "restarts of the worker group before the job fails (PET_MAX_RESTARTS)",
        JOB,
        (Flag(("--max-restarts",), read="int"),),
    ),
    Value(
        "restartPolicy",
        choice(RESTART_POLICIES, nullable=True),
        None,
        f"what happens when a pod fails; null = {DEFAULT_RESTART_POLICY}: retry exit codes >= "
        f"{names.FIRST_RETRYABLE_EXIT_CODE} ({exit_codes.PREEMPTED} = preempted after "
        f"saving a checkpoint), fail on 1-{names.FIRST_RETRYABLE_EXIT_CODE - 1}. PyTorchJob "
        "ExitCode: training-operator v1.9 recreates the pod for every such code without end "
        "(backoffLimit does not count them; launch's retries.without_progress does). "
        "IndexedJob ExitCode: a podFailurePolicy (preemptions and a lost peer's codes not "
        "counted). OnFailure: the kubelet restarts the container in place, each restart "
        "counted against backoffLimit summed over all pods. "
        + "; ".join(
            f"{kind.chart_kind}: {', '.join(kind.restart_policies)}"
            for kind in KINDS.values()
            if kind.restart_policies
        ),
        JOB,
        (Flag(("--restart-policy",)),),
    ),
    Value(
        "backoffLimit",
        integer(minimum=0, nullable=True),
        None,
        f"null = {DEFAULT_BACKOFF_LIMIT}. What it bounds differs by kind. PyTorchJob "
        "(training-operator v1.9): restarts of Running pods only; with restartPolicy ExitCode "
        "it never bounds the recreations of pods that exit >= 128 (0 fails the job at the "
        "first failure). IndexedJob: failed pods summed over all pods, preemptions and a lost "
        "peer's exit codes not counted. TrainJob (with trainJob.ownRuntime): the Job's "
        "backoffLimit (counted pod failures summed over the pods) and the JobSet's "
        "failurePolicy.maxRestarts (restarts of the whole gang). On every kind launch's own "
        "budget, `retries.without_progress`, ends a job whose restarts make no progress",
        JOB,
        (Flag(("--backoff-limit",), read="int"),),
    ),
    Value(
        "ttlSecondsAfterFinished",
        integer(minimum=0, nullable=True),
        None,
        "delete the finished job after this many seconds; null = keep it",
        JOB,
        (Flag(("--ttl-seconds-after-finished",), read="int"),),
    ),
    Value(
        "cleanPodPolicy",
        choice(CLEAN_POD_POLICIES, nullable=True),
        None,
        f"PyTorchJob: pods deleted when the job ends: {', '.join(CLEAN_POD_POLICIES)}; null = "
        f"{DEFAULT_CLEAN_POD_POLICY} (stops agents left waiting in torchrun's exit barrier)",
        JOB,
        (Flag(("--clean-pod-policy",)),),
    ),
    Value(
        "terminationGracePeriodSeconds",
        integer(minimum=0),
        names.TERMINATION_GRACE_PERIOD_SECONDS,
        "seconds between SIGTERM and SIGKILL; workers save a checkpoint within "
        f"{trainer.PREEMPT_GRACE_SECONDS} s of SIGTERM",
        JOB,
        (Flag(("--termination-grace-period-seconds",), read="int"),),
    ),
    Value(
        "pytorchJob.masterReplica",
        boolean(),
        False,
        "PyTorchJob: a Master replica (rank 0) and nodes-1 Workers instead of nodes Workers. "
        "training-operator v1.9 then adds its init-pytorch container (alpine, no "
        "securityContext) to every Worker: Pod Security `restricted` rejects those pods and an "
        "air-gapped cluster cannot pull the image, unless the operator runs with "
        "--pytorch-init-container-image / --pytorch-init-container-template-file",
        JOB,
        (switch("--master-replica"),),
    ),
    Value(
        "trainJob.runtimeName",
        text(P.DNS1123_SUBDOMAIN, maxLength=253),
        DEFAULT_RUNTIME,
        "the training runtime's name (with trainJob.ownRuntime false)",
        JOB,
        (Flag(("--runtime-name",)),),
    ),
    Value(
        "trainJob.ownRuntime",
        boolean(),
        True,
        "render a TrainingRuntime named after the job and run on it: the torch runtime with "
        "a JobSet failurePolicy (restart the gang when its Job fails, at most backoffLimit "
        "times; fail at once on exit codes 1-127) and a Job whose pods run restartPolicy Never "
        "under a pod failure policy that does not count a preemption or a lost peer's exit. "
        "false: trainJob.runtimeKind/runtimeName as installed (Trainer's torch-distributed: "
        "pods restart OnFailure, the Job's backoffLimit 6 counts restarts summed over all "
        "pods, and the first failed Job fails the TrainJob)",
        JOB,
        (switch("--own-runtime"),),
    ),
    Value(
        "trainJob.runtimeKind",
        choice(RUNTIME_KINDS),
        RUNTIME_KINDS[0],
        " or ".join(RUNTIME_KINDS) + " (namespaced)",
        JOB,
        (Flag(("--runtime-kind",)),),
    ),
    Value(
        "env",
        {**string_map(), "propertyNames": env_name(trainer.USER_ENV_SETTINGS)},
        {},
        'environment of the training container, NAME: "value" (strings: quote numbers, or use '
        "--set-string with helm). Not the names kubeddp, torchrun or the operator set "
        f"(KUBEDDP_* but {', '.join(trainer.USER_ENV_SETTINGS)}; PET_*, TORCHELASTIC_*, "
        "MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, LOCAL_WORLD_SIZE, PATH)",
        POD,
        (pairs("--env"),),
    ),
    Value(
        "extraEnv",
        env_entries(trainer.USER_ENV_SETTINGS),
        [],
        "more env entries as Kubernetes EnvVar objects (valueFrom a Secret...); the same names "
        "as `env` are refused, and each name once",
        DATA,
        (
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
        "envFrom",
        k8s_list("EnvFromSource"),
        [],
        "every key of these Secrets/ConfigMaps as environment variables, e.g. [{secretRef: "
        "{name: s3-credentials}}] (not for a TrainJob: Trainer v2.3 has no envFrom; use "
        "extraEnv entries valueFrom a Secret key)",
        DATA,
        (
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
        "volumes",
        {
            "type": "array",
            "items": data_volume(
                P.DNS1123_LABEL,
                names.KUBEDDP_VOLUMES,
                P.paths_and_parents(names.RESERVED_MOUNT_PATHS),
            ),
        },
        [],
        "more volumes of the training container, each a Kubernetes volume (a name and one "
        f"source: {', '.join(VOLUME_SOURCES)}) with its mountPath, and readOnly/subPath; e.g. "
        "[{name: data, mountPath: /data, readOnly: true, persistentVolumeClaim: {claimName: "
        "datasets}}]. A mount may not hide kubeddp's paths or the image's (/dev/shm, "
        f"{trainer.CHECKPOINT_DIR}, {names.CONFIG_DIR}, /tmp, /opt/venv...)",
        DATA,
        (
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
        "podAnnotations",
        string_map(P.QUALIFIED_NAME),
        {},
        "extra annotations of the training pods",
        POD,
        (pairs("--pod-annotation"),),
    ),
    Value(
        "podLabels",
        label_map(),
        {},
        "extra labels of the training pods",
        POD,
        (pairs("--pod-label"),),
    ),
    Value(
        "nodeSelector",
        label_map(),  # label keys and values, as the API server checks them
        {},
        "node selector of the pods",
        SCHEDULING,
        (pairs("--node-selector"),),
    ),
    Value(
        "tolerations",
        k8s_list("Toleration"),
        [],
        "tolerations of the pods",
        SCHEDULING,
        (Flag(("--tolerations",), read="yaml-list", metavar="YAML|FILE"),),
    ),
    Value(
        "affinity",
        k8s("Affinity"),
        {},
        "affinity of the pods",
        SCHEDULING,
        (Flag(("--affinity",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        "priorityClassName",
        text(P.optional(P.DNS1123_SUBDOMAIN)),
        "",
        "PriorityClass of the pods (PyTorchJob, IndexedJob; set it in the runtime for a TrainJob)",
        SCHEDULING,
        (Flag(("--priority-class",)),),
    ),
    Value(
        "istio.optOut",
        boolean(),
        True,
        f'annotate pods {names.ISTIO_INJECT_ANNOTATION}: "false"',
        SCHEDULING,
        (switch("--istio-opt-out"),),
    ),
    Value(
        "kueue.queueName",
        text(P.optional(P.DNS1123_LABEL), maxLength=63),
        "",
        f"admit the job through this Kueue LocalQueue (label {names.KUEUE_QUEUE_LABEL})",
        SCHEDULING,
        (Flag(("--queue",)),),
    ),
    Value(
        "gang.scheduler",
        choice(("", *GANG_SCHEDULERS)),
        "",
        '"" (off), ' + " or ".join(GANG_SCHEDULERS) + " (pods get its schedulerName)",
        SCHEDULING,
        (Flag(("--gang",)),),
    ),
    Value(
        "gang.queue",
        text(P.optional(P.DNS1123_LABEL)),
        "",
        "Volcano queue of the PodGroup; empty = the scheduler's default",
        SCHEDULING,
        (Flag(("--gang-queue",)),),
    ),
    Value(
        "podSecurityContext",
        k8s("PodSecurityContext"),
        names.POD_SECURITY_CONTEXT,
        f"the pods' security context: the restricted Pod Security Standard, uid/gid "
        f"{names.IMAGE_UID} (the image's user)",
        POD,
        (Flag(("--pod-security-context",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        "securityContext",
        k8s("SecurityContext"),
        names.CONTAINER_SECURITY_CONTEXT,
        "the training container's security context: restricted, read-only root filesystem "
        "(/tmp, /dev/shm and /checkpoints are volumes)",
        POD,
        (Flag(("--security-context",), read="yaml-map", metavar="YAML|FILE"),),
    ),
    Value(
        "serviceAccount.create",
        boolean(),
        False,
        "create a ServiceAccount for the pods",
        POD,
        (switch("--create-service-account"),),
    ),
    Value(
        "serviceAccount.name",
        OPTIONAL_SUBDOMAIN,
        "",
        "the account to create or use; empty = the full name when created, else none (the "
        "namespace default, token not mounted). A named account's token is mounted",
        POD,
        (Flag(("--service-account",)),),
    ),
    Value(
        "serviceAccount.annotations",
        string_map(P.QUALIFIED_NAME),
        {},
        "annotations of the created account (e.g. cloud workload identity)",
        POD,
        (pairs("--service-account-annotation"),),
    ),
    Value(
        "config",
        config_json_schema(),
        {},
        "the trainer config file (sections workload, train, ddp, checkpoint, metrics; see "
        f"docs/config-reference.md), shipped in a ConfigMap at {trainer.CONFIG_FILE}. "
        f"checkpoint.dir defaults to {trainer.CHECKPOINT_DIR}. Example: {{train: {{epochs: 3}}}}",
        TRAINER,
        (
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
        "trainer.script",
        text(maxLength=4096),
        "",
        "your training script: a Python file in the image (an absolute path, e.g. "
        "/app/train.py); empty = the built-in trainer",
        TRAINER,
        (Flag(("--script",), metavar="PATH", help="run this Python file of the image"),),
    ),
    Value(
        "trainer.module",
        text(P.optional(P.PYTHON_MODULE), maxLength=1024),
        "",
        "your training module (`python -m NAME`), installed in the image; empty = the built-in "
        "trainer",
        TRAINER,
        (Flag(("--module",), metavar="NAME", help="run this module of the image (python -m)"),),
    ),
    Value(
        "trainer.spawnsWorkers",
        {"type": ["boolean", "null"]},
        None,
        "your script starts its own workers (mp.spawn, mp.Process): launch runs it once, on one "
        "node only; null = detected in the script",
        TRAINER,
        (switch("--spawns-workers"),),
    ),
    Value(
        "trainer.args",
        {"type": "array", "items": {"type": "string"}},
        [],
        "the arguments of your script or module, as written (`kubeddp render ... -- ARGS`)",
        TRAINER,
        (
            Flag(
                (PROGRAM_ARGS,),
                read="program-args",
                help="what follows -- on the command line: your program's arguments",
            ),
        ),
    ),
    Value(
        "checkpoints.existingClaim",
        OPTIONAL_SUBDOMAIN,
        "",
        "mount this existing PersistentVolumeClaim instead of creating one",
        TRAINER,
        (Flag(("--checkpoint-pvc",), metavar="CLAIM"),),
    ),
    Value(
        "checkpoints.size",
        text(P.optional(P.QUANTITY), nullable=True),
        None,
        f"size of the claim <job>-checkpoints that is created; null = {DEFAULT_CHECKPOINT_SIZE}",
        TRAINER,
        (Flag(("--checkpoint-size",), metavar="SIZE"),),
    ),
    Value(
        "checkpoints.storageClassName",
        text(P.optional(P.DNS1123_SUBDOMAIN)),
        "",
        "StorageClass of the created claim; empty = the cluster's default",
        TRAINER,
        (Flag(("--storage-class",)),),
    ),
    Value(
        "checkpoints.accessMode",
        choice(CHECKPOINT_ACCESS_MODES, nullable=True),
        None,
        "access mode of the created claim; null = ReadWriteOnce, or ReadWriteMany when "
        "storage is mount and the job has more than one pod. ReadWriteOnce and "
        "ReadWriteOncePod with several pods need storage keeper (the default)",
        TRAINER,
        (Flag(("--checkpoint-access-mode",)),),
    ),
    Value(
        "checkpoints.storage",
        choice(CHECKPOINT_STORAGE, nullable=True),
        None,
        "how the training pods reach the claim. keeper: one small pod (<job>-keeper, the same "
        "image) mounts it and serves it; each training pod keeps checkpoint.dir on an emptyDir, "
        "filled from the keeper before its workers start, and sends back what rank 0 writes: "
        "works with ReadWriteOnce storage, the default of EKS, GKE, AKS and kind. mount: every "
        "pod mounts the claim at checkpoint.dir (more than one pod: ReadWriteMany storage). "
        "null = keeper when the job has more than one pod, unless accessMode is ReadWriteMany; "
        "else mount",
        TRAINER,
        (Flag(("--checkpoint-storage",)),),
    ),
    Value(
        "checkpoints.lostOnRetry",
        boolean(),
        False,
        f"put {trainer.CHECKPOINT_DIR} on an emptyDir instead of a claim: checkpoints are lost "
        "with the pod, so every retry (a recreated pod) and every preemption starts training "
        "from scratch",
        TRAINER,
        (switch("--checkpoints-lost-on-retry"),),
    ),
    Value(
        "monitoring.podMonitor.enabled",
        boolean(),
        False,
        f"create a PodMonitor scraping {names.METRICS_PATH} on port {names.METRICS_PORT_NAME} "
        f"({trainer.METRICS_PORT}) of every pod of the job",
        MONITORING,
        (switch("--podmonitor"),),
    ),
    Value(
        "monitoring.podMonitor.labels",
        label_map(),
        {},
        "extra labels, e.g. {release: kube-prometheus-stack} to match podMonitorSelector",
        MONITORING,
        (pairs("--podmonitor-label"),),
    ),
    Value(
        "monitoring.podMonitor.interval",
        text(P.DURATION),
        "",
        "scrape interval, e.g. 15s; empty = Prometheus' default",
        MONITORING,
        (Flag(("--podmonitor-interval",)),),
    ),
    Value(
        "monitoring.dashboard.enabled",
        boolean(),
        False,
        "ship the Grafana dashboard (dashboards/*.json) in a ConfigMap labelled "
        'grafana_dashboard: "1" for the Grafana sidecar',
        MONITORING,
        (switch("--dashboard"),),
    ),
    Value(
        "monitoring.dashboard.labels",
        label_map(),
        {},
        "extra labels of the dashboard ConfigMap",
        MONITORING,
        (pairs("--dashboard-label"),),
    ),
    Value(
        "monitoring.prometheusRule.enabled",
        boolean(),
        False,
        "create a PrometheusRule with the job's alerts (needs the PodMonitor or another scrape)",
        MONITORING,
    ),
    Value(
        "monitoring.prometheusRule.labels",
        label_map(),
        {},
        "extra labels, e.g. {release: kube-prometheus-stack} to match ruleSelector",
        MONITORING,
    ),
    Value(
        "monitoring.prometheusRule.noProgressSeconds",
        integer(minimum=1),
        300,
        "a rank with no progress for this long is stalled (alert KubeddpRankStalled)",
        MONITORING,
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
