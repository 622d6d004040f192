"""PyTorchJob (Kubeflow Training Operator v1): Workers only (static or elastic), or a Master and
Workers.

The admission rules are written from the Training Operator v1.9 PyTorchJob webhook, so
`kubeddp validate` reports them before `kubectl apply` would fail (or, for enums the CRD leaves
open, before the controller would misbehave).
"""

from __future__ import annotations

from kubeddp.tools.manifests import schema_checks
from kubeddp.tools.manifests.kinds import (
    Issue,
    JobKind,
    Lands,
    Takes,
    container_names,
    mapping,
    name_issues,
    values,
)
from kubeddp.tools.manifests.resources import Resource
from kubeddp.trainer import constants as trainer

OPERATOR_VERSION = "v1.9.4"
INSTALL = (
    f"install the Kubeflow training operator {OPERATOR_VERSION}: kubectl apply --server-side -k "
    f'"github.com/kubeflow/trainer.git/manifests/overlays/standalone?ref={OPERATOR_VERSION}"'
)
CONTAINER = "pytorch"
PORT_NAME = "pytorchjob-port"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
REPLICA_TYPES = ("Master", "Worker")
RESTART_POLICIES = ("ExitCode", "OnFailure", "Never", "Always")
CLEAN_POD_POLICIES = ("None", "Running", "All")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")
ELASTIC_RDZV_BACKEND = "c10d"
# gang.scheduler value -> the pods' schedulerName
GANG_SCHEDULERS = {"volcano": "volcano", "scheduler-plugins": "scheduler-plugins-scheduler"}
REPLICAS = "spec.pytorchReplicaSpecs"
RESOURCE_KIND = "PyTorchJob"  # its pods are in its replica specs
# Every chart value: where it lands (tests/unit/test_kind_values.py sets each one).
TAKES: Takes = {
    **values.common(RESOURCE_KIND, RESOURCE_KIND, (values.CONFIG_MAP, values.CLAIM, RESOURCE_KIND)),
    **{path: Lands((RESOURCE_KIND,)) for path in values.ONLY_FOR_PYTORCHJOB},
    "nprocPerNode": Lands((RESOURCE_KIND,)),
    "restartPolicy": Lands((RESOURCE_KIND,)),
    "backoffLimit": Lands((RESOURCE_KIND,)),
    "ttlSecondsAfterFinished": Lands((RESOURCE_KIND,)),
    "timeLimit": Lands((RESOURCE_KIND,)),  # runPolicy.activeDeadlineSeconds
    **values.ONLY_FOR_TRAINJOB,
}


def _static_issues(replicas: dict) -> list[Issue]:
    """Not elastic: Workers only (the webhook needs no Master), or exactly one Master."""
    master = replicas.get("Master")
    if master is None:
        if not isinstance(replicas.get("Worker"), dict):
            return [(REPLICAS, "has neither Master nor Worker; add Workers (or a Master)")]
        return []
    if not isinstance(master, dict) or master.get("replicas") != 1:
        found = master.get("replicas") if isinstance(master, dict) else master
        return [(f"{REPLICAS}.Master.replicas", f"is {found!r}; write replicas: 1 explicitly")]
    return []


INIT_CONTAINER_WARNING = (
    "training-operator v1.9 adds its init-pytorch container (image alpine:3.10, nslookup, no "
    "securityContext) to every Worker of a job with a Master: a namespace enforcing Pod "
    "Security `restricted` rejects those pods and an air-gapped cluster cannot pull the image; "
    "leave the Master out (kubeddp's default: Workers only, worker-0 is rank 0), or have the "
    "operator run with --pytorch-init-container-image (a mirrored image) and "
    "--pytorch-init-container-template-file (a template with a securityContext)"
)


def warnings(doc: dict) -> list[Issue]:
    """Accepted by the operator, but likely to fail on a locked-down cluster."""
    replicas = mapping(mapping(doc.get("spec")).get("pytorchReplicaSpecs"))
    if "Master" in replicas:
        return [(f"{REPLICAS}.Master", INIT_CONTAINER_WARNING)]
    return []


def _elastic_issues(spec: dict, elastic: dict, replicas: dict) -> list[Issue]:
    issues: list[Issue] = []
    if "Master" in replicas:
        issues.append(
            (
                f"{REPLICAS}.Master",
                "an elastic PyTorchJob has only Worker replicas; remove the Master",
            )
        )
    low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
    if isinstance(low, int) and isinstance(high, int) and low > high:
        issues.append(("spec.elasticPolicy", f"minReplicas {low} > maxReplicas {high}"))
    if isinstance(low, int) and low < 1:
        issues.append(("spec.elasticPolicy.minReplicas", f"{low} must be >= 1"))
    backend = elastic.get("rdzvBackend")
    if backend is not None and backend not in RDZV_BACKENDS:
        issues.append(
            (
                "spec.elasticPolicy.rdzvBackend",
                f"{backend!r} is unknown; use one of {', '.join(RDZV_BACKENDS)}",
            )
        )
    if "nProcPerNode" in elastic and "nprocPerNode" in spec:
        issues.append(
            (
                "spec.elasticPolicy.nProcPerNode",
                "set together with spec.nprocPerNode; keep only spec.nprocPerNode",
            )
        )
    return issues


def _replica_issues(key: str, replica: dict) -> list[Issue]:
    issues: list[Issue] = []
    if key not in REPLICA_TYPES:
        issues.append((f"{REPLICAS}.{key}", "unknown replica type; use Master or Worker"))
    policy = replica.get("restartPolicy")
    if policy is not None and policy not in RESTART_POLICIES:
        issues.append(
            (
                f"{REPLICAS}.{key}.restartPolicy",
                f"{policy!r} is unknown; use one of {', '.join(RESTART_POLICIES)}",
            )
        )
    if CONTAINER not in container_names(replica.get("template")):
        issues.append(
            (
                f"{REPLICAS}.{key}.template.spec.containers",
                f"no container named {CONTAINER!r}; the operator "
                "injects the rendezvous env into that container only",
            )
        )
    return issues


def admission_issues(doc: dict) -> list[Issue]:
    spec = mapping(doc.get("spec"))
    replicas = mapping(spec.get("pytorchReplicaSpecs"))
    issues: list[Issue] = []
    for key, replica in replicas.items():  # the SDK models leave the pod loose: check it here
        if isinstance(replica, dict) and "template" in replica:
            path = ["spec", "pytorchReplicaSpecs", key, "template"]
            issues += schema_checks.pod_template_issues(replica["template"], path)
    issues += name_issues(doc)
    if not replicas:
        issues.append((REPLICAS, "is empty; add a Master (and Workers) or, for elastic, Workers"))
    elastic = spec.get("elasticPolicy")
    if elastic is None:
        issues += _static_issues(replicas)
    else:
        issues += _elastic_issues(spec, mapping(elastic), replicas)
    for key, replica in replicas.items():
        issues += _replica_issues(key, mapping(replica))
    nproc = spec.get("nprocPerNode")
    if nproc is not None and not (str(nproc) in KIND.nproc_words or str(nproc).isdigit()):
        issues.append(("spec.nprocPerNode", f"{nproc!r} must be auto, cpu, gpu or an integer"))
    clean = mapping(spec.get("runPolicy")).get("cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        issues.append(
            (
                "spec.runPolicy.cleanPodPolicy",
                f"{clean!r} is unknown; use one of {', '.join(CLEAN_POD_POLICIES)}",
            )
        )
    return issues


def replica_lines(status: dict) -> list[str]:
    return [
        f"  {replica}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        for replica, counts in sorted((status.get("replicaStatuses") or {}).items())
        if isinstance(counts, dict)
    ]


def node_rank_selector(job: dict, rank: int) -> str:
    """The Master is node rank 0 when there is one, and the Workers follow it."""
    replicas = mapping(mapping(job.get("spec")).get("pytorchReplicaSpecs"))
    if "Master" in replicas and rank == 0:
        return f"{REPLICA_TYPE_LABEL}=master,{REPLICA_INDEX_LABEL}=0"
    index = rank - 1 if "Master" in replicas else rank
    return f"{REPLICA_TYPE_LABEL}=worker,{REPLICA_INDEX_LABEL}={index}"


KIND = JobKind(
    name="pytorchjob",
    chart_kind="PyTorchJob",
    position=0,
    help="Kubeflow Training Operator v1; elastic too",
    resource=Resource(RESOURCE_KIND, "kubeflow.org", "v1", "pytorchjobs"),
    container=CONTAINER,
    job_name_label=JOB_NAME_LABEL,
    index_labels=(REPLICA_TYPE_LABEL, REPLICA_INDEX_LABEL),
    rendezvous_port=trainer.PYTORCHJOB_PORT,
    rendezvous_port_name=PORT_NAME,
    success_conditions=("Succeeded",),
    replica_lines=replica_lines,
    replica_selector=lambda replica: f"{REPLICA_TYPE_LABEL}={replica.lower()}",
    node_rank_selector=node_rank_selector,
    admission_issues=admission_issues,
    warnings=warnings,
    schema_issues=schema_checks.pytorchjob_issues,
    install_hint=INSTALL,
    restart_policies=RESTART_POLICIES,
    takes=TAKES,
    auto_rank=1,  # kind auto: training-operator v1 (legacy), where Trainer is not served
    chart_facts={
        "gangSchedulers": GANG_SCHEDULERS,
        "elasticRdzvBackend": ELASTIC_RDZV_BACKEND,
        # Workers only: kubeddp's own rendezvous env (the operator sets no master for it)
        "masterAddrEnv": trainer.ENV_MASTER_ADDR,
        "masterPortEnv": trainer.ENV_MASTER_PORT,
        "nnodesEnv": trainer.ENV_NNODES,
        "nodeRankEnv": trainer.ENV_NODE_RANK,
        "replicaIndexLabel": REPLICA_INDEX_LABEL,
    },
)
