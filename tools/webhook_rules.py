"""The admission rules the operators enforce that their CRD schemas do not.

Written from the Training Operator v1.9 PyTorchJob webhook and the Trainer v2.3 TrainJob
webhook behaviour, so `kubeddp validate` reports them before `kubectl apply` would fail (or, for
enums the CRD leaves open, before the controller would misbehave). Each returns
`(field path, message)` pairs.
"""

from __future__ import annotations

from typing import Any

from kubeddp.tools.jobspec import CLEAN_POD_POLICIES, DNS1035, NPROC_WORDS
from kubeddp.trainer import constants as C

REPLICA_TYPES = ("Master", "Worker")
REPLICA_RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")
TRAINJOB_RESERVED_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
Issue = tuple[str, str]


def _mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def name_issues(doc: dict) -> list[Issue]:
    name = _mapping(doc.get("metadata")).get("name")
    if not isinstance(name, str) or not DNS1035.match(name) or len(name) > 63:
        return [
            (
                "metadata.name",
                f"{name!r} is not a DNS-1035 label (lower-case letters, digits,"
                " '-', starting with a letter, at most 63 characters)",
            )
        ]
    return []


def _container_names(template: Any) -> list[str]:
    containers = _mapping(_mapping(template).get("spec")).get("containers") or []
    return [c.get("name") for c in containers if isinstance(c, dict)]


def pytorchjob_issues(doc: dict) -> list[Issue]:
    issues = name_issues(doc)
    spec = _mapping(doc.get("spec"))
    replicas = _mapping(spec.get("pytorchReplicaSpecs"))
    elastic = spec.get("elasticPolicy")
    base = "spec.pytorchReplicaSpecs"
    if not replicas:
        issues.append((base, "is empty; add a Master (and Workers) or, for elastic, Workers"))
    for key in replicas:
        if key not in REPLICA_TYPES:
            issues.append((f"{base}.{key}", "unknown replica type; use Master or Worker"))
    if elastic is None:
        master = replicas.get("Master")
        if not isinstance(master, dict):
            issues.append(
                (f"{base}.Master", "is missing; a non-elastic PyTorchJob needs exactly one Master")
            )
        elif master.get("replicas") != 1:
            issues.append(
                (
                    f"{base}.Master.replicas",
                    f"is {master.get('replicas')!r}; write replicas: 1 explicitly",
                )
            )
    else:
        elastic = _mapping(elastic)
        if "Master" in replicas:
            issues.append(
                (
                    f"{base}.Master",
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
    for key, replica in replicas.items():
        replica = _mapping(replica)
        policy = replica.get("restartPolicy")
        if policy is not None and policy not in REPLICA_RESTART_POLICIES:
            issues.append(
                (
                    f"{base}.{key}.restartPolicy",
                    f"{policy!r} is unknown; use one of {', '.join(REPLICA_RESTART_POLICIES)}",
                )
            )
        if C.PYTORCHJOB_CONTAINER not in _container_names(replica.get("template")):
            issues.append(
                (
                    f"{base}.{key}.template.spec.containers",
                    f"no container named {C.PYTORCHJOB_CONTAINER!r}; the operator "
                    "injects the rendezvous env into that container only",
                )
            )
    nproc = spec.get("nprocPerNode")
    if nproc is not None and not (str(nproc) in NPROC_WORDS or str(nproc).isdigit()):
        issues.append(("spec.nprocPerNode", f"{nproc!r} must be auto, cpu, gpu or an integer"))
    clean = _mapping(spec.get("runPolicy")).get("cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        issues.append(
            (
                "spec.runPolicy.cleanPodPolicy",
                f"{clean!r} is unknown; use one of {', '.join(CLEAN_POD_POLICIES)}",
            )
        )
    return issues


def trainjob_issues(doc: dict) -> list[Issue]:
    issues = name_issues(doc)
    spec = _mapping(doc.get("spec"))
    trainer = _mapping(spec.get("trainer"))
    for index, var in enumerate(trainer.get("env") or []):
        name = _mapping(var).get("name")
        if name in TRAINJOB_RESERVED_ENV:
            issues.append(
                (
                    f"spec.trainer.env[{index}].name",
                    f"{name} is set by the torch "
                    "runtime; remove it (use trainer.numNodes / numProcPerNode)",
                )
            )
    for key in ("numNodes", "numProcPerNode"):
        value = trainer.get(key)
        if isinstance(value, int) and value < 1:
            issues.append((f"spec.trainer.{key}", f"{value} must be >= 1"))
    for p_index, patch in enumerate(spec.get("runtimePatches") or []):
        runtime = _mapping(_mapping(patch).get("trainingRuntimeSpec"))
        jobs = _mapping(_mapping(runtime.get("template")).get("spec")).get("replicatedJobs") or []
        for j_index, job in enumerate(jobs):
            job = _mapping(job)
            if job.get("name") != "node":
                continue
            pod = _mapping(_mapping(job.get("template")).get("spec")).get("template")
            for c_index, name in enumerate(_container_names(pod)):
                if name != C.TRAINJOB_CONTAINER:
                    issues.append(
                        (
                            f"spec.runtimePatches[{p_index}].trainingRuntimeSpec.template"
                            f".spec.replicatedJobs[{j_index}].template.spec.template.spec"
                            f".containers[{c_index}].name",
                            f"{name!r}: the trainer container is named {C.TRAINJOB_CONTAINER!r}",
                        )
                    )
    return issues


def indexedjob_issues(doc: dict) -> list[Issue]:
    """Only for Jobs kubeddp renders: the rendezvous env must match the Job's shape."""
    labels = _mapping(_mapping(doc.get("metadata")).get("labels"))
    spec = _mapping(doc.get("spec"))
    if labels.get(C.LABEL_MANAGED_BY) != C.APP_NAME or spec.get("completionMode") != "Indexed":
        return []
    issues = name_issues(doc)
    name = doc["metadata"].get("name")
    completions = spec.get("completions")
    if spec.get("parallelism") != completions:
        issues.append(
            (
                "spec.parallelism",
                f"must equal completions ({completions}): every node "
                "must run at once for the rendezvous",
            )
        )
    pod = _mapping(_mapping(spec.get("template")).get("spec"))
    if pod.get("subdomain") != name:
        issues.append(
            (
                "spec.template.spec.subdomain",
                f"must be {name!r} (the headless Service) so {name}-0.{name} resolves",
            )
        )
    for container in pod.get("containers") or []:
        env = {
            e.get("name"): e.get("value")
            for e in _mapping(container).get("env") or []
            if isinstance(e, dict)
        }
        nnodes = env.get(C.ENV_INDEXEDJOB_NNODES)
        if nnodes is not None and nnodes != str(completions):
            issues.append(
                (
                    "spec.template.spec.containers.env",
                    f"{C.ENV_INDEXEDJOB_NNODES}="
                    f"{nnodes} but completions is {completions}; make them equal",
                )
            )
    return issues
