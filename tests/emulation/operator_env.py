"""What the operators would create from a manifest: pods, their labels, init containers and env,
and the restart settings the controllers act on (tests/emulation/controllers.py decides).

An independent model of the controllers: it imports nothing from kubeddp, so a drift between
kubeddp's renderer/launcher and the real operators makes a test fail. The env each operator
injects is the project's table tests/emulation/operator_table.csv (every row cites the upstream
file it was read from; test_operator_env.py checks it against the reference
kubeflow-env-matrix.csv where that file is present): every variable set below must have a row
there, and its constants are read from it. The rest (defaults, labels, the init container,
restart settings) cites the upstream file inline: kubeflow/trainer v1.9.4 for training-operator
v1 (TO), kubeflow/trainer v2.3.0 (TR) with kubernetes-sigs/jobset v0.12.0 (JS), and
kubernetes/api v0.36.2 / the Kubernetes Job controller (K8S).
"""

from __future__ import annotations

import base64
import copy
import csv
import functools
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # loaded by path from other tests

from tests.helpers.reference import CRDS, read_text  # noqa: E402

TABLE_FILE = Path(__file__).with_name("operator_table.csv")
TORCH_RUNTIME_FILE = CRDS / "clustertrainingruntime_torch-distributed.v2.3.0.yaml"

TRAINING_OPERATOR = "training-operator v1"
TRAINER = "trainer v2"
JOB_CONTROLLER = "kubernetes Job controller"

# TO pytorch_types.go / pytorch_defaults.go / common_types.go
PYTORCHJOB_CONTAINER = "pytorch"
PYTORCHJOB_PORT_NAME = "pytorchjob-port"
PYTORCHJOB_DEFAULT_RESTART_POLICY = "OnFailure"  # pytorch_types.go L30-31
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
# TO initcontainer.go: the template, image flag default and max tries
INIT_CONTAINER_NAME = "init-pytorch"
INIT_CONTAINER_IMAGE = "alpine:3.10"  # --pytorch-init-container-image default
INIT_CONTAINER_MAX_TRIES = 100  # --pytorch-init-container-max-tries default (2 s apart)
# Trainer v2 (pkg/constants)
TRAINJOB_CONTAINER = "node"
TRAINJOB_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
JOBSET_DEFAULT_RESTART_POLICY = "OnFailure"  # JS jobset_webhook.go Default L124-127
# batch/v1 Job controller and API
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_DEFAULT_BACKOFF_LIMIT = 6  # K8S-API batch/v1 types.go L350-354
# The image's ENTRYPOINT is `tini -- kubeddp launch`; tini's job (PID 1, reaping) is the
# harness's here, so a container without `command` runs `kubeddp launch` + its args.
IMAGE_ENTRYPOINT = ["kubeddp", "launch"]


class ManifestError(ValueError):
    """The manifest is not something the emulated operators accept."""


# ---------------------------------------------------------------- the operator table
@functools.cache
def table() -> list[dict[str, str]]:
    with TABLE_FILE.open(newline="") as handle:
        return list(csv.DictReader(handle))


def table_row(operator: str, env_var: str, condition: str) -> dict[str, str]:
    for row in table():
        if (row["operator"], row["env_var"], row["condition"]) == (operator, env_var, condition):
            return row
    raise ManifestError(f"operator_table.csv has no row {operator} / {condition} / {env_var}")


def table_int(operator: str, env_var: str, condition: str) -> int:
    """The first number in the row's value (e.g. `29500 (constants.ContainerTrainerPort...)`)."""
    value = table_row(operator, env_var, condition)["value_or_formula"]
    found = re.search(r"\b(\d+)\b", value)
    if not found:
        raise ManifestError(f"operator_table.csv: {env_var} ({condition}) holds no number")
    return int(found.group(1))


def injected(operator: str, conditions: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """`env`, after checking each variable against the table: `conditions` maps a variable to
    the table condition under which the model sets it."""
    for name in env:
        table_row(operator, name, conditions[name])
    return env


# PyTorchJob: the defaulted port (`... (defaulted to 23456)`) and nprocPerNode (`auto`)
MASTER_PRESENT = "Master replica present"
NPROC_SET = 'spec.nprocPerNode set (defaulted to "auto" unless elasticPolicy.nProcPerNode set)'
PYTORCHJOB_DEFAULT_PORT = table_int(TRAINING_OPERATOR, "MASTER_PORT", MASTER_PRESENT)
PYTORCHJOB_DEFAULT_NPROC = "auto"
TRAINJOB_MASTER_PORT = table_int(TRAINER, "PET_MASTER_PORT", "command != torchtune entrypoint")


@dataclass
class PodPlan:
    """One pod the operator would create, before it is given an address."""

    name: str  # metadata.name (also the hostname unless `hostname` is set)
    hostname: str
    subdomain: str  # "" or the headless Service giving `<hostname>.<subdomain>`
    service: str  # "" or a per-pod Service named like the pod (PyTorchJob)
    replica_type: str  # Master | Worker | node | index
    index: int
    container: dict[str, Any]
    volumes: list[dict[str, Any]]
    operator_env: dict[str, str]  # injected by the controller (wins over the container's env)
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    init_containers: list[dict[str, Any]] = field(default_factory=list)  # run first, in order
    security_context: dict[str, Any] = field(default_factory=dict)  # the pod's
    termination_grace_seconds: float = 30.0  # the API default

    @property
    def dns_names(self) -> list[str]:
        names = [self.name, self.hostname]
        if self.subdomain:
            names.append(f"{self.hostname}.{self.subdomain}")
        if self.service:
            names.append(self.service)
        return list(dict.fromkeys(names))


@dataclass
class JobPlan:
    kind: str  # PyTorchJob | TrainJob | IndexedJob
    name: str
    pods: list[PodPlan]
    # replica type -> the job's policy: PyTorchJob ExitCode | OnFailure | Never | Always; the
    # batch Jobs (IndexedJob, TrainJob's) the pod template's Never | OnFailure
    restart_policy: dict[str, str]
    backoff_limit: int | None  # None: no limit (an unset PyTorchJob runPolicy.backoffLimit)
    elastic: bool = False
    pod_failure_rules: list[dict[str, Any]] = field(default_factory=list)  # batch/v1 Job
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: dict[str, dict[str, bytes]] = field(default_factory=dict)  # name -> key -> value
    claims: list[dict[str, Any]] = field(default_factory=list)  # PersistentVolumeClaims to make
    deployments: list[PodPlan] = field(default_factory=list)  # pods of Deployments beside the job
    # TrainJob: the JobSet's failurePolicy (None: the first failed Job fails the JobSet)
    jobset_failure_policy: dict[str, Any] | None = None
    # The job's activeDeadlineSeconds (PyTorchJob runPolicy, Job spec, TrainJob spec)
    active_deadline_seconds: int | None = None

    @property
    def batch_job(self) -> bool:
        """Pods made by the Job controller (Indexed Job, a TrainJob's Jobs): its recreation
        back-off applies."""
        return self.kind in ("IndexedJob", "TrainJob")


def load_documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _one_container(template: dict[str, Any], name: str, kind: str) -> dict[str, Any]:
    containers = template.get("spec", {}).get("containers", [])
    for c in containers:
        if c.get("name") == name:
            return copy.deepcopy(c)
    found = [c.get("name") for c in containers]
    raise ManifestError(
        f"{kind}: no container named {name!r} (found {found}); the operator needs it"
    )


def _container_port(container: dict[str, Any], port_name: str, default: int) -> int:
    for port in container.get("ports", []):
        if port.get("name") == port_name:
            return int(port["containerPort"])
    return default


def _nproc_int(nproc: str) -> int:
    # getNprocPerNodeInt: auto/cpu/gpu (anything not an integer) counts as 1
    try:
        return int(nproc)
    except ValueError:
        return 1


def _grace(pod_spec: dict[str, Any]) -> float:
    return float(pod_spec.get("terminationGracePeriodSeconds", 30))


# ---------------------------------------------------------------- PyTorchJob (v1.9)
def _elastic_env(
    job: dict[str, Any], worker_container: dict[str, Any]
) -> tuple[dict[str, str], dict[str, str]]:
    """TO elastic.go Generate L68-122: the env, and each variable's table condition."""
    name = job["metadata"]["name"]
    spec = job["spec"]
    policy = spec["elasticPolicy"]
    workers = spec["pytorchReplicaSpecs"].get("Worker", {}).get("replicas", 1)
    lo = policy.get("minReplicas")
    hi = policy.get("maxReplicas")
    # setElasticPolicy: min/max default from each other, else from Worker.replicas
    lo = lo if lo is not None else (hi if hi is not None else workers)
    hi = hi if hi is not None else lo
    host = policy.get("rdzvHost") or f"{name}-worker-0"
    port = policy.get("rdzvPort") or _container_port(
        worker_container, PYTORCHJOB_PORT_NAME, PYTORCHJOB_DEFAULT_PORT
    )
    env = {
        "PET_NNODES": f"{lo}:{hi}",
        "PET_RDZV_ENDPOINT": f"{host}:{port}",
        "PET_RDZV_BACKEND": policy.get("rdzvBackend") or "c10d",
    }
    conditions = dict.fromkeys(env, "elasticPolicy != nil")
    optional = {
        "PET_MAX_RESTARTS": ("maxRestarts", "elasticPolicy.maxRestarts set"),
        "PET_RDZV_ID": ("rdzvId", "elasticPolicy.rdzvId set"),
    }
    for var, (key, condition) in optional.items():
        if policy.get(key) is not None and policy.get(key) != "":
            env[var] = str(policy[key])
            conditions[var] = condition
    if policy.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
        conditions["PET_RDZV_CONF"] = "elasticPolicy.rdzvConf set"
    if policy.get("standalone"):
        env["PET_STANDALONE"] = ""
        conditions["PET_STANDALONE"] = "elasticPolicy.standalone == true"
    if policy.get("nProcPerNode") is not None:
        env["PET_NPROC_PER_NODE"] = str(policy["nProcPerNode"])
        conditions["PET_NPROC_PER_NODE"] = (
            "elasticPolicy.nProcPerNode set (deprecated; webhook forbids together with "
            "spec.nprocPerNode)"
        )
    return env, conditions


def init_pytorch_container(job_name: str) -> dict[str, Any]:
    """TO initcontainer.go initContainerTemplate L35-46 (no securityContext at all), with the
    default image and tries; MasterAddr = <job>-master-0."""
    master = f"{job_name}-master-0"
    script = (
        f"err=1;for i in $(seq {INIT_CONTAINER_MAX_TRIES}); do if nslookup {master}; then "
        "err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err"
    )
    return {
        "name": INIT_CONTAINER_NAME,
        "image": INIT_CONTAINER_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "resources": {
            "limits": {"cpu": "100m", "memory": "20Mi"},
            "requests": {"cpu": "50m", "memory": "10Mi"},
        },
        "command": ["sh", "-c", script],
    }


def _pytorchjob_labels(name: str, rtype: str, index: int, has_master: bool) -> dict[str, str]:
    """TO pod.go L402-408: job name, replica type (lower case) and index; job-role=master on
    the Master, or on Worker 0 when there is no Master (IsMasterRole)."""
    labels = {
        JOB_NAME_LABEL: name,
        REPLICA_TYPE_LABEL: rtype.lower(),
        REPLICA_INDEX_LABEL: str(index),
    }
    if (rtype == "Master") or (not has_master and rtype == "Worker" and index == 0):
        labels[JOB_ROLE_LABEL] = "master"
    return labels


def pytorchjob_plan(job: dict[str, Any]) -> JobPlan:
    name = job["metadata"]["name"]
    spec = job["spec"]
    replica_specs: dict[str, Any] = spec["pytorchReplicaSpecs"]
    unknown = set(replica_specs) - {"Master", "Worker"}
    if unknown:
        raise ManifestError(f"PyTorchJob replica types {sorted(unknown)}: only Master/Worker")
    has_master = "Master" in replica_specs
    if has_master and replica_specs["Master"].get("replicas", 1) != 1:
        raise ManifestError("PyTorchJob Master.replicas must be 1 (the webhook rejects others)")
    elastic = spec.get("elasticPolicy") is not None
    if elastic and "Worker" not in replica_specs:
        raise ManifestError("PyTorchJob with elasticPolicy needs a Worker (webhook validateSpec)")
    nproc = str(spec.get("nprocPerNode") or PYTORCHJOB_DEFAULT_NPROC)
    total = sum(int(r.get("replicas", 1)) for r in replica_specs.values())
    master_env: dict[str, str] = {}
    if has_master:
        master_container = _one_container(
            replica_specs["Master"]["template"], PYTORCHJOB_CONTAINER, "PyTorchJob Master"
        )
        port = _container_port(master_container, PYTORCHJOB_PORT_NAME, PYTORCHJOB_DEFAULT_PORT)
        addr = f"{name}-master-0"
        master_env = {
            "MASTER_ADDR": addr,
            "PET_MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "PET_MASTER_PORT": str(port),
            "WORLD_SIZE": str(total * _nproc_int(nproc)),
        }
    pods: list[PodPlan] = []
    for rtype in ("Master", "Worker"):
        if rtype not in replica_specs:
            continue
        rspec = replica_specs[rtype]
        template = rspec["template"]
        pod_spec = template.get("spec", {})
        container = _one_container(template, PYTORCHJOB_CONTAINER, f"PyTorchJob {rtype}")
        shared = {"PYTHONUNBUFFERED": "1", **master_env}
        conditions = {"PYTHONUNBUFFERED": "always", **dict.fromkeys(master_env, MASTER_PRESENT)}
        if elastic:
            elastic_env, elastic_conditions = _elastic_env(job, container)
            shared.update(elastic_env)
            conditions.update(elastic_conditions)
        else:
            shared["PET_NNODES"] = str(total)
            conditions["PET_NNODES"] = "elasticPolicy == nil"
        if not (elastic and spec["elasticPolicy"].get("nProcPerNode") is not None):
            shared["PET_NPROC_PER_NODE"] = nproc
            conditions["PET_NPROC_PER_NODE"] = NPROC_SET
        for index in range(int(rspec.get("replicas", 1))):
            env = dict(shared)
            if has_master:
                rank = index + 1 if rtype == "Worker" else index
                env["RANK"] = str(rank)
                env["PET_NODE_RANK"] = str(rank)
            rank_conditions = {"RANK": MASTER_PRESENT, "PET_NODE_RANK": MASTER_PRESENT}
            injected(TRAINING_OPERATOR, {**conditions, **rank_conditions}, env)
            pod_name = f"{name}-{rtype.lower()}-{index}"
            init = copy.deepcopy(pod_spec.get("initContainers", []))
            if has_master and rtype == "Worker":  # appended, never to the Master (L116-132)
                init.append(init_pytorch_container(name))
            pods.append(
                PodPlan(
                    name=pod_name,
                    hostname=pod_name,
                    subdomain="",
                    service=pod_name,  # the operator makes one headless Service per pod
                    replica_type=rtype,
                    index=index,
                    container=container,
                    volumes=copy.deepcopy(pod_spec.get("volumes", [])),
                    operator_env=env,
                    annotations=dict(template.get("metadata", {}).get("annotations", {})),
                    labels={
                        **template.get("metadata", {}).get("labels", {}),
                        **_pytorchjob_labels(name, rtype, index, has_master),
                    },
                    init_containers=init,
                    security_context=copy.deepcopy(pod_spec.get("securityContext", {})),
                    termination_grace_seconds=_grace(pod_spec),
                )
            )
    backoff = spec.get("runPolicy", {}).get("backoffLimit")
    return JobPlan(
        kind="PyTorchJob",
        name=name,
        pods=pods,
        restart_policy={
            r: s.get("restartPolicy", PYTORCHJOB_DEFAULT_RESTART_POLICY)
            for r, s in replica_specs.items()
        },
        # No default is applied: unset means no limit (common_types.go L210-212).
        backoff_limit=None if backoff is None else int(backoff),
        elastic=elastic,
        active_deadline_seconds=spec.get("runPolicy", {}).get("activeDeadlineSeconds"),
    )


# ---------------------------------------------------------------- TrainJob (Trainer v2.3)
def _merge_by_name(base: list[Any], patch: list[Any]) -> list[Any]:
    """Strategic-merge of lists keyed by `name` (containers, volumes, env, volumeMounts)."""
    merged = copy.deepcopy(base)
    for item in patch:
        if isinstance(item, dict) and "name" in item:
            for i, existing in enumerate(merged):
                if isinstance(existing, dict) and existing.get("name") == item["name"]:
                    merged[i] = _merge(existing, item)
                    break
            else:
                merged.append(copy.deepcopy(item))
        else:
            merged.append(copy.deepcopy(item))
    return merged


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = _merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        return _merge_by_name(base, patch)
    return copy.deepcopy(patch)


def merge_resources(runtime: dict[str, Any], per_node: dict[str, Any]) -> dict[str, Any]:
    """TR trainingruntime.go MergeResourceRequirements: limits and requests merged key by key,
    the TrainJob's value winning; claims merged by name."""
    merged: dict[str, Any] = {}
    for section in ("limits", "requests"):
        values = {**(runtime.get(section) or {}), **(per_node.get(section) or {})}
        if values:
            merged[section] = values
    claims = _merge_by_name(runtime.get("claims") or [], per_node.get("claims") or [])
    if claims:
        merged["claims"] = claims
    return merged


def _cpu_count(quantity: Any) -> int:
    text = str(quantity)
    value = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return math.ceil(value)


def _trainjob_nproc(trainer: dict[str, Any], runtime_resources: dict[str, Any]) -> str:
    """TR torch.go L121-135: numProcPerNode; else from resourcesPerNode if set (alone, not
    merged), else the runtime's: `auto` with a resource named like *gpu*, else the CPU count."""
    if trainer.get("numProcPerNode") is not None:
        return str(trainer["numProcPerNode"])
    resources = trainer.get("resourcesPerNode") or runtime_resources or {}
    for section in ("requests", "limits"):
        if any(
            "gpu" in k.lower() and str(v) != "0" for k, v in (resources.get(section) or {}).items()
        ):
            return "auto"
    for section in ("requests", "limits"):
        cpu = (resources.get(section) or {}).get("cpu")
        if cpu is not None and _cpu_count(cpu) > 0:
            return str(max(1, _cpu_count(cpu)))
    return "1"


def trainjob_plan(job: dict[str, Any], runtime: dict[str, Any] | None = None) -> JobPlan:
    name = job["metadata"]["name"]
    spec = job["spec"]
    runtime = runtime or yaml.safe_load(read_text(TORCH_RUNTIME_FILE))
    ref = spec.get("runtimeRef", {})
    if ref.get("name") != runtime["metadata"]["name"]:
        raise ManifestError(
            f"TrainJob runtimeRef {ref.get('name')!r}: the emulation only has "
            f"{runtime['metadata']['name']!r}"
        )
    rspec = runtime["spec"]
    jobset = copy.deepcopy(rspec["template"]["spec"])
    for patch in spec.get("runtimePatches") or []:
        patched = (patch.get("trainingRuntimeSpec") or {}).get("template", {}).get("spec", {})
        jobset = _merge(jobset, patched)
    rjobs = [
        r
        for r in jobset["replicatedJobs"]
        if r.get("template", {}).get("metadata", {}).get("labels", {}).get(TRAINJOB_ANCESTOR_LABEL)
        == "trainer"
        or r["name"] == TRAINJOB_CONTAINER
    ]
    if len(rjobs) != 1:
        raise ManifestError("TrainJob runtime: expected one replicatedJob for the trainer step")
    rjob = rjobs[0]
    template = rjob["template"]["spec"]["template"]
    pod_spec = template.get("spec", {})
    container = _one_container(template, TRAINJOB_CONTAINER, "TrainJob")
    runtime_resources = copy.deepcopy(container.get("resources") or {})
    trainer = spec.get("trainer") or {}
    # builder.go Trainer L129-137: each of image, command, args replaces the runtime's alone
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            container[key] = copy.deepcopy(trainer[key])
    if trainer.get("env"):
        container["env"] = _merge_by_name(container.get("env", []), trainer["env"])
    if trainer.get("resourcesPerNode"):
        container["resources"] = merge_resources(runtime_resources, trainer["resourcesPerNode"])
    nnodes = int(trainer.get("numNodes") or rspec.get("mlPolicy", {}).get("numNodes") or 1)
    master = f"{name}-{rjob['name']}-0-0.{name}"
    operator_env: dict[str, str] = {}
    if spec.get("trainer") is not None:  # PET_* only with a trainer (torch.go L139-143)
        operator_env = injected(
            TRAINER,
            {
                "PET_NNODES": "trainJob.spec.trainer != nil",
                "PET_NPROC_PER_NODE": "trainJob.spec.trainer != nil",
                "PET_MASTER_ADDR": "command != torchtune entrypoint",
                "PET_MASTER_PORT": "command != torchtune entrypoint",
            },
            {
                "PET_NNODES": str(nnodes),
                "PET_NPROC_PER_NODE": _trainjob_nproc(trainer, runtime_resources),
                "PET_MASTER_ADDR": master,
                "PET_MASTER_PORT": str(TRAINJOB_MASTER_PORT),
            },
        )
    # PET_NODE_RANK (torch.go) and the Job controller's JOB_COMPLETION_INDEX are fieldRefs on
    # the completion index, resolved per pod.
    table_row(TRAINER, "PET_NODE_RANK", "trainJob.spec.trainer != nil")
    table_row(JOB_CONTROLLER, "JOB_COMPLETION_INDEX", "completionMode == Indexed")
    index_ref = {
        "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}
    }
    field_env = [{"name": "JOB_COMPLETION_INDEX", "valueFrom": index_ref}]
    if spec.get("trainer") is not None:
        field_env.append({"name": "PET_NODE_RANK", "valueFrom": copy.deepcopy(index_ref)})
    reserved = set(operator_env) | {e["name"] for e in field_env}
    container["env"] = [e for e in container.get("env", []) if e.get("name") not in reserved]
    container["env"] += field_env
    pods = []
    for index in range(nnodes):
        pod_name = f"{name}-{rjob['name']}-0-{index}"
        pods.append(
            PodPlan(
                name=pod_name,
                hostname=pod_name,
                subdomain=name,  # JobSet's headless Service is named after the JobSet
                service="",
                replica_type=rjob["name"],
                index=index,
                container=copy.deepcopy(container),
                volumes=copy.deepcopy(pod_spec.get("volumes", [])),
                operator_env=dict(operator_env),
                annotations={
                    **template.get("metadata", {}).get("annotations", {}),
                    COMPLETION_INDEX_ANNOTATION: str(index),
                },
                labels={
                    **template.get("metadata", {}).get("labels", {}),
                    COMPLETION_INDEX_ANNOTATION: str(index),
                },
                init_containers=copy.deepcopy(pod_spec.get("initContainers", [])),
                security_context=copy.deepcopy(pod_spec.get("securityContext", {})),
                termination_grace_seconds=_grace(pod_spec),
            )
        )
    batch_spec = rjob["template"]["spec"]
    backoff = batch_spec.get("backoffLimit")
    return JobPlan(
        kind="TrainJob",
        name=name,
        pods=pods,
        # JobSet defaults an empty pod restartPolicy to OnFailure; the Job API defaults
        # backoffLimit to 6 (JobSet and Trainer set neither).
        restart_policy={
            rjob["name"]: pod_spec.get("restartPolicy") or JOBSET_DEFAULT_RESTART_POLICY
        },
        backoff_limit=JOB_DEFAULT_BACKOFF_LIMIT if backoff is None else int(backoff),
        pod_failure_rules=copy.deepcopy(
            (batch_spec.get("podFailurePolicy") or {}).get("rules", [])
        ),
        jobset_failure_policy=copy.deepcopy(jobset.get("failurePolicy")),
        active_deadline_seconds=spec.get("activeDeadlineSeconds"),  # the TrainJob's own
    )


# ---------------------------------------------------------------- TrainJob status (gate)
STATUS_GATE = "TrainJobStatus feature gate on"
STATUS_ENV = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT",
              "KUBEFLOW_TRAINER_SERVER_TOKEN")  # fmt: skip
STATUS_VOLUME = "kubeflow-trainer-token"  # TR trainjobstatus.go tokenVolumeName
STATUS_TOKEN_SECONDS = 3600  # TR trainjobstatus.go tokenExpirySeconds


def _table_value(env_var: str) -> str:
    """The row's value up to its first space (the rest explains it)."""
    return table_row(TRAINER, env_var, STATUS_GATE)["value_or_formula"].split(" ", 1)[0]


def status_url(namespace: str, name: str) -> str:
    template = _table_value("KUBEFLOW_TRAINER_SERVER_URL")
    return template.replace("<namespace>", namespace).replace("<trainjob-name>", name)


def with_trainjob_status(plan: JobPlan, namespace: str) -> JobPlan:
    """TR trainjobstatus.go, registered when the controller's TrainJobStatus gate is on:
    EnforceMLPolicy upserts the three variables and the projected volume (a token for this
    TrainJob's audience, and the CA from ConfigMap <name>-tls-config, which Build makes) into
    every container of the trainer's pods. The ConfigMap's data is the cluster's CA."""
    url_name, ca_name, token_name = STATUS_ENV
    ca_path, token_path = _table_value(ca_name), _table_value(token_name)
    mount_path = str(Path(ca_path).parent)
    # utils.go: TokenAudience is StatusUrl's path without its leading "/apis/"
    audience = status_url(namespace, plan.name).split("/apis/", 1)[1]
    volume = {
        "name": STATUS_VOLUME,
        "projected": {"sources": [
            {"serviceAccountToken": {"audience": audience,
                                     "expirationSeconds": STATUS_TOKEN_SECONDS,
                                     "path": Path(token_path).name}},
            {"configMap": {"name": f"{plan.name}-tls-config",
                           "items": [{"key": "ca.crt", "path": Path(ca_path).name}]}},
        ]},
    }  # fmt: skip
    env = {url_name: status_url(namespace, plan.name), ca_name: ca_path, token_name: token_path}
    for pod in plan.pods:
        pod.operator_env.update(injected(TRAINER, dict.fromkeys(env, STATUS_GATE), env))
        mounts = [m for m in pod.container.get("volumeMounts", []) if m["name"] != STATUS_VOLUME]
        mounts.append({"name": STATUS_VOLUME, "mountPath": mount_path, "readOnly": True})
        pod.container["volumeMounts"] = mounts
        pod.volumes = [v for v in pod.volumes if v["name"] != STATUS_VOLUME] + [volume]
    return plan


def _pod_failure_rules(job_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return copy.deepcopy((job_spec.get("podFailurePolicy") or {}).get("rules", []))


# ---------------------------------------------------------------- Indexed Job (batch/v1)
def indexedjob_plan(job: dict[str, Any]) -> JobPlan:
    name = job["metadata"]["name"]
    spec = job["spec"]
    if spec.get("completionMode") != "Indexed":
        raise ManifestError(f"Job {name}: completionMode must be Indexed")
    completions = int(spec["completions"])
    if int(spec.get("parallelism", 1)) < completions:
        raise ManifestError(f"Job {name}: parallelism < completions; some ranks would never start")
    template = spec["template"]
    pod_spec = template["spec"]
    containers = pod_spec["containers"]
    if len(containers) != 1:
        raise ManifestError(f"Job {name}: the emulation runs exactly one container per pod")
    restart = pod_spec.get("restartPolicy")
    if restart not in ("Never", "OnFailure"):
        raise ManifestError(f"Job {name}: template restartPolicy {restart!r}: Never or OnFailure")
    if spec.get("podFailurePolicy") and restart != "Never":
        raise ManifestError(f"Job {name}: podFailurePolicy needs restartPolicy Never")
    subdomain = pod_spec.get("subdomain", "")
    table_row(JOB_CONTROLLER, "JOB_COMPLETION_INDEX", "completionMode == Indexed")
    pods = []
    for index in range(completions):
        hostname = f"{name}-{index}"  # the Job controller sets hostname = <job>-<index>
        pods.append(
            PodPlan(
                name=hostname,
                hostname=hostname,
                subdomain=subdomain,
                service="",
                replica_type="index",
                index=index,
                container=copy.deepcopy(containers[0]),
                volumes=copy.deepcopy(pod_spec.get("volumes", [])),
                operator_env={"JOB_COMPLETION_INDEX": str(index)},
                annotations={
                    **template.get("metadata", {}).get("annotations", {}),
                    COMPLETION_INDEX_ANNOTATION: str(index),
                },
                labels={
                    **template.get("metadata", {}).get("labels", {}),
                    COMPLETION_INDEX_ANNOTATION: str(index),
                    "batch.kubernetes.io/job-name": name,
                },
                init_containers=copy.deepcopy(pod_spec.get("initContainers", [])),
                security_context=copy.deepcopy(pod_spec.get("securityContext", {})),
                termination_grace_seconds=_grace(pod_spec),
            )
        )
    backoff = spec.get("backoffLimit")
    return JobPlan(
        kind="IndexedJob",
        name=name,
        pods=pods,
        restart_policy={"index": restart},
        backoff_limit=JOB_DEFAULT_BACKOFF_LIMIT if backoff is None else int(backoff),
        pod_failure_rules=_pod_failure_rules(spec),
        active_deadline_seconds=spec.get("activeDeadlineSeconds"),
    )


# ---------------------------------------------------------------- a manifest stream
def plan_from_documents(docs: list[dict[str, Any]]) -> JobPlan:
    """The job in a rendered manifest stream (ConfigMaps and PVCs alongside)."""
    configmaps = {
        d["metadata"]["name"]: dict(d.get("data") or {}) for d in docs if d["kind"] == "ConfigMap"
    }
    jobs = [d for d in docs if d["kind"] in ("PyTorchJob", "TrainJob", "Job")]
    if len(jobs) != 1:
        raise ManifestError(f"expected one PyTorchJob/TrainJob/Job, found {len(jobs)}")
    job = jobs[0]
    runtimes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "TrainingRuntime"}
    if job["kind"] == "PyTorchJob":
        plan = pytorchjob_plan(job)
    elif job["kind"] == "TrainJob":
        ref = job["spec"].get("runtimeRef", {})
        runtime = runtimes.get(ref.get("name")) if ref.get("kind") == "TrainingRuntime" else None
        if ref.get("kind") == "TrainingRuntime" and runtime is None:
            raise ManifestError(f"TrainJob runtimeRef {ref}: no such TrainingRuntime in the stream")
        plan = trainjob_plan(job, runtime)
    else:
        plan = indexedjob_plan(job)
    plan.configmaps = configmaps
    plan.secrets = {d["metadata"]["name"]: secret_data(d) for d in docs if d["kind"] == "Secret"}
    plan.claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    services = [d for d in docs if d["kind"] == "Service"]
    plan.deployments = [deployment_pod(d, services) for d in docs if d["kind"] == "Deployment"]
    return plan


def secret_data(secret: dict[str, Any]) -> dict[str, bytes]:
    """A Secret's keys as the kubelet writes them: `data` base64-decoded, `stringData` as is
    (the API server merges stringData over data)."""
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    data.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
    return data


def deployment_pod(deployment: dict[str, Any], services: list[dict[str, Any]]) -> PodPlan:
    """The one pod of a single-replica Deployment (K8S: the ReplicaSet names it
    <deployment>-<template hash>-<random>; restartPolicy Always), and the Service that selects
    it by labels (its DNS name then resolves to this pod)."""
    spec = deployment["spec"]
    if spec.get("replicas", 1) != 1:
        raise ManifestError("only single-replica Deployments are emulated")
    template = spec["template"]
    pod_spec = template["spec"]
    labels = dict(template.get("metadata", {}).get("labels", {}))
    selecting = [
        s["metadata"]["name"]
        for s in services
        if s["spec"].get("selector")
        and all(labels.get(k) == v for k, v in s["spec"]["selector"].items())
    ]
    name = f"{deployment['metadata']['name']}-5d8f7c9b4-x2k9q"
    (container,) = pod_spec["containers"]
    return PodPlan(
        name=name,
        hostname=name,
        subdomain="",
        service=selecting[0] if selecting else "",
        replica_type="Deployment",
        index=0,
        container=copy.deepcopy(container),
        volumes=copy.deepcopy(pod_spec.get("volumes", [])),
        operator_env={},
        annotations=dict(template.get("metadata", {}).get("annotations", {})),
        labels=labels,
        security_context=copy.deepcopy(pod_spec.get("securityContext", {})),
        termination_grace_seconds=_grace(pod_spec),
    )


# ---------------------------------------------------------------- container env, as kubelet
_FIELD_REF = re.compile(r"^metadata\.(annotations|labels)\['([^']+)'\]$")


def resolve_field_ref(path: str, pod: PodPlan, namespace: str, pod_ip: str) -> str:
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": namespace,
        "status.podIP": pod_ip,
        "spec.hostname": pod.hostname,
        "spec.nodeName": pod.hostname,  # each emulated pod runs on a node of its own
    }
    if path in simple:
        return simple[path]
    match = _FIELD_REF.match(path)
    if match:
        source = pod.annotations if match.group(1) == "annotations" else pod.labels
        if match.group(2) not in source:
            raise ManifestError(f"fieldRef {path!r}: pod {pod.name} has no such {match.group(1)}")
        return source[match.group(2)]
    raise ManifestError(f"fieldRef {path!r} is not emulated")


def container_env(pod: PodPlan, namespace: str, pod_ip: str) -> dict[str, str]:
    """The container's env as the kubelet would set it: manifest env, then operator env."""
    env: dict[str, str] = {}
    for item in pod.container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        elif "fieldRef" in item.get("valueFrom", {}):
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = resolve_field_ref(path, pod, namespace, pod_ip)
        elif "valueFrom" in item:
            raise ManifestError(f"env {item['name']}: only value and fieldRef are emulated")
        else:
            env[item["name"]] = ""
    env.update(pod.operator_env)  # the operator appends its vars; the last duplicate wins
    return env


_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion in env values, command and args."""
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)
