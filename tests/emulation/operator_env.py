"""What the operators would create from a manifest: pod names, env, containers, success rules.

This is an independent model of the controllers, written from
../shared/reference/kubeflow-env-matrix.csv (Training Operator v1.9 `envvar.go`/`elastic.go`/
`master.go`/`pytorchjob_controller.go`, Trainer v2.3 `torch.go`, the Job controller). It
deliberately imports nothing from kubeddp: the operator's constants below are the operator's,
so a drift between kubeddp's renderer/launcher and the real operators makes a test fail.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
TORCH_RUNTIME_FILE = REFERENCE / "crds" / "clustertrainingruntime_torch-distributed.v2.3.0.yaml"

# Training Operator v1 (pytorch_types.go / pytorch_defaults.go)
PYTORCHJOB_CONTAINER = "pytorch"
PYTORCHJOB_PORT_NAME = "pytorchjob-port"
PYTORCHJOB_DEFAULT_PORT = 23456
PYTORCHJOB_DEFAULT_NPROC = "auto"
# Trainer v2 (pkg/constants)
TRAINJOB_CONTAINER = "node"
TRAINJOB_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINJOB_MASTER_PORT = 29500
# batch/v1 Job controller
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_DEFAULT_BACKOFF_LIMIT = 6
# The image's ENTRYPOINT is `tini -- kubeddp launch`; tini's job (PID 1, reaping) is the
# harness's here, so a container without `command` runs `kubeddp launch` + its args.
IMAGE_ENTRYPOINT = ["kubeddp", "launch"]


class ManifestError(ValueError):
    """The manifest is not something the emulated operators accept."""


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
    restart_policy: dict[str, str]  # replica type -> Never | OnFailure | Always | ExitCode
    backoff_limit: int
    elastic: bool = False
    fail_job_exit_codes: set[int] = field(default_factory=set)  # Job podFailurePolicy FailJob
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)


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


# ---------------------------------------------------------------- PyTorchJob (v1.9)
def _elastic_env(job: dict[str, Any], worker_container: dict[str, Any]) -> dict[str, str]:
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
    if policy.get("maxRestarts") is not None:
        env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
    if policy.get("rdzvId"):
        env["PET_RDZV_ID"] = str(policy["rdzvId"])
    if policy.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
    if policy.get("standalone"):
        env["PET_STANDALONE"] = ""
    if policy.get("nProcPerNode") is not None:
        env["PET_NPROC_PER_NODE"] = str(policy["nProcPerNode"])
    return env


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
        container = _one_container(template, PYTORCHJOB_CONTAINER, f"PyTorchJob {rtype}")
        shared = {"PYTHONUNBUFFERED": "1", **master_env}
        if elastic:
            shared.update(_elastic_env(job, container))
        else:
            shared["PET_NNODES"] = str(total)
        if not (elastic and spec["elasticPolicy"].get("nProcPerNode") is not None):
            shared["PET_NPROC_PER_NODE"] = nproc
        for index in range(int(rspec.get("replicas", 1))):
            env = dict(shared)
            if has_master:
                rank = index + 1 if rtype == "Worker" else index
                env["RANK"] = str(rank)
                env["PET_NODE_RANK"] = str(rank)
            pod_name = f"{name}-{rtype.lower()}-{index}"
            pods.append(
                PodPlan(
                    name=pod_name,
                    hostname=pod_name,
                    subdomain="",
                    service=pod_name,  # the operator makes one headless Service per pod
                    replica_type=rtype,
                    index=index,
                    container=container,
                    volumes=copy.deepcopy(template.get("spec", {}).get("volumes", [])),
                    operator_env=env,
                    annotations=dict(template.get("metadata", {}).get("annotations", {})),
                    labels=dict(template.get("metadata", {}).get("labels", {})),
                )
            )
    run_policy = spec.get("runPolicy", {})
    return JobPlan(
        kind="PyTorchJob",
        name=name,
        pods=pods,
        restart_policy={r: s.get("restartPolicy", "OnFailure") for r, s in replica_specs.items()},
        backoff_limit=int(run_policy.get("backoffLimit", JOB_DEFAULT_BACKOFF_LIMIT)),
        elastic=elastic,
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


def _cpu_count(quantity: Any) -> int:
    text = str(quantity)
    value = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return math.ceil(value)


def _trainjob_nproc(trainer: dict[str, Any]) -> str:
    if trainer.get("numProcPerNode") is not None:
        return str(trainer["numProcPerNode"])
    resources = trainer.get("resourcesPerNode") or {}
    for section in ("limits", "requests"):
        if any("gpu" in k for k in (resources.get(section) or {})):
            return "auto"
    for section in ("requests", "limits"):
        cpu = (resources.get(section) or {}).get("cpu")
        if cpu is not None:
            return str(max(1, _cpu_count(cpu)))
    return "1"


def trainjob_plan(job: dict[str, Any], runtime: dict[str, Any] | None = None) -> JobPlan:
    name = job["metadata"]["name"]
    spec = job["spec"]
    runtime = runtime or yaml.safe_load(TORCH_RUNTIME_FILE.read_text())
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
    container = _one_container(template, TRAINJOB_CONTAINER, "TrainJob")
    trainer = spec.get("trainer") or {}
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            container[key] = copy.deepcopy(trainer[key])
    if trainer.get("env"):
        container["env"] = _merge_by_name(container.get("env", []), trainer["env"])
    if trainer.get("resourcesPerNode"):
        container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
    nnodes = int(trainer.get("numNodes") or rspec.get("mlPolicy", {}).get("numNodes") or 1)
    master = f"{name}-{rjob['name']}-0-0.{name}"
    operator_env = {
        "PET_NNODES": str(nnodes),
        "PET_NPROC_PER_NODE": _trainjob_nproc(trainer),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": str(TRAINJOB_MASTER_PORT),
    }
    # PET_NODE_RANK is a fieldRef on the completion-index annotation, resolved per pod.
    container["env"] = [
        e for e in container.get("env", []) if e.get("name") not in operator_env
    ] + [
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}
            },
        }
    ]
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
                volumes=copy.deepcopy(template.get("spec", {}).get("volumes", [])),
                operator_env=dict(operator_env),
                annotations={
                    **template.get("metadata", {}).get("annotations", {}),
                    COMPLETION_INDEX_ANNOTATION: str(index),
                },
                labels=dict(template.get("metadata", {}).get("labels", {})),
            )
        )
    batch_spec = rjob["template"]["spec"]
    return JobPlan(
        kind="TrainJob",
        name=name,
        pods=pods,
        restart_policy={rjob["name"]: template.get("spec", {}).get("restartPolicy", "Never")},
        backoff_limit=int(batch_spec.get("backoffLimit", 0)),
    )


# ---------------------------------------------------------------- Indexed Job (batch/v1)
def _fail_job_codes(job_spec: dict[str, Any]) -> set[int]:
    codes: set[int] = set()
    for rule in (job_spec.get("podFailurePolicy") or {}).get("rules", []):
        on_exit = rule.get("onExitCodes")
        if rule.get("action") == "FailJob" and on_exit and on_exit.get("operator") == "In":
            codes.update(int(v) for v in on_exit["values"])
    return codes


def indexedjob_plan(job: dict[str, Any]) -> JobPlan:
    name = job["metadata"]["name"]
    spec = job["spec"]
    if spec.get("completionMode") != "Indexed":
        raise ManifestError(f"Job {name}: completionMode must be Indexed")
    completions = int(spec["completions"])
    if int(spec.get("parallelism", 1)) < completions:
        raise ManifestError(f"Job {name}: parallelism < completions; some ranks would never start")
    template = spec["template"]
    containers = template["spec"]["containers"]
    if len(containers) != 1:
        raise ManifestError(f"Job {name}: the emulation runs exactly one container per pod")
    subdomain = template["spec"].get("subdomain", "")
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
                volumes=copy.deepcopy(template["spec"].get("volumes", [])),
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
            )
        )
    return JobPlan(
        kind="IndexedJob",
        name=name,
        pods=pods,
        restart_policy={"index": template["spec"].get("restartPolicy", "Never")},
        backoff_limit=int(spec.get("backoffLimit", JOB_DEFAULT_BACKOFF_LIMIT)),
        fail_job_exit_codes=_fail_job_codes(spec),
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
    if job["kind"] == "PyTorchJob":
        plan = pytorchjob_plan(job)
    elif job["kind"] == "TrainJob":
        plan = trainjob_plan(job)
    else:
        plan = indexedjob_plan(job)
    plan.configmaps = configmaps
    return plan


# ---------------------------------------------------------------- container env, as kubelet
_FIELD_REF = re.compile(r"^metadata\.(annotations|labels)\['([^']+)'\]$")


def resolve_field_ref(path: str, pod: PodPlan, namespace: str, pod_ip: str) -> str:
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": namespace,
        "status.podIP": pod_ip,
        "spec.hostname": pod.hostname,
    }
    if path in simple:
        return simple[path]
    match = _FIELD_REF.match(path)
    if match:
        source = pod.annotations if match.group(1) == "annotations" else pod.labels
        return source.get(match.group(2), "")
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
