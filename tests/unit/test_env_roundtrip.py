"""Env round trip: the env each operator would inject into each pod of a rendered job, fed to
`kubeddp launch --dry-run`, gives one consistent rendezvous across the pods.

The operator env is computed here from the rules in the operators' env table
(tests/emulation/operator_table.csv: Training Operator v1.9 PyTorchJob, Trainer v2.3 torch
runtime, batch/v1 Indexed Job),
independent of kubeddp's code: only the rendered manifest is an input.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.helpers import cli
from tests.helpers.render import job_of

REPO = Path(__file__).resolve().parents[2]
# What every pod gets from the kubelet, whatever the operator.
POD_BASE_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}

pytestmark = pytest.mark.timeout(240)


def container_env(container: dict, labels: dict[str, str] | None = None) -> dict[str, str]:
    """Literal values, and downward-API references to the pod's labels (`labels`)."""
    env = {}
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif labels is not None and "fieldRef" in entry.get("valueFrom", {}):
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            if not path.startswith("metadata.labels["):
                continue  # the pod's and node's names (diagnostics) say nothing of the plan
            key = path.removeprefix("metadata.labels['").removesuffix("']")
            env[entry["name"]] = labels[key]
    return env


def named_port(container: dict, name: str, default: int) -> int:
    for port in container.get("ports") or []:
        if port.get("name") == name:
            return int(port["containerPort"])
    return default


def pytorchjob_pods(job: dict) -> list[dict[str, str]]:
    """Training Operator v1.9: envvar.go, master.go, elastic.go (see the CSV)."""
    name, spec = job["metadata"]["name"], job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(int(r.get("replicas", 1)) for r in replicas.values())
    nproc = str(spec.get("nprocPerNode", "auto"))
    elastic = spec.get("elasticPolicy")
    pods = []
    for rtype, replica in replicas.items():
        container = next(
            c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch"
        )
        for index in range(int(replica.get("replicas", 1))):
            env = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": nproc}
            if "Master" in replicas:
                master = next(
                    c
                    for c in replicas["Master"]["template"]["spec"]["containers"]
                    if c["name"] == "pytorch"
                )
                port = str(named_port(master, "pytorchjob-port", 23456))
                rank = str(index if rtype == "Master" else index + 1)
                env.update(
                    MASTER_ADDR=f"{name}-master-0",
                    PET_MASTER_ADDR=f"{name}-master-0",
                    MASTER_PORT=port,
                    PET_MASTER_PORT=port,
                    RANK=rank,
                    PET_NODE_RANK=rank,
                    WORLD_SIZE=str(total * (int(nproc) if nproc.isdigit() else 1)),
                )
            if elastic is None:
                env["PET_NNODES"] = str(total)
            else:
                worker = next(
                    c
                    for c in replicas["Worker"]["template"]["spec"]["containers"]
                    if c["name"] == "pytorch"
                )
                port = elastic.get("rdzvPort") or named_port(worker, "pytorchjob-port", 23456)
                host = elastic.get("rdzvHost") or f"{name}-worker-0"
                env.update(
                    PET_NNODES=f"{elastic['minReplicas']}:{elastic['maxReplicas']}",
                    PET_RDZV_ENDPOINT=f"{host}:{port}",
                    PET_RDZV_BACKEND=elastic.get("rdzvBackend", "c10d"),
                )
                if "maxRestarts" in elastic:
                    env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
                if "rdzvId" in elastic:
                    env["PET_RDZV_ID"] = elastic["rdzvId"]
            # pod.go: every pod is labelled with its replica type and index
            labels = {
                "training.kubeflow.org/replica-type": rtype.lower(),
                "training.kubeflow.org/replica-index": str(index),
            }
            pods.append({**POD_BASE_ENV, **container_env(container, labels), **env})
    return pods


def cpu_count(quantity: str) -> int:
    if quantity.endswith("m"):
        return math.ceil(int(quantity[:-1]) / 1000)
    return math.ceil(float(quantity))


def trainjob_pods(job: dict) -> list[dict[str, str]]:
    """Trainer v2.3 torch plugin (torch.go): PET_* only, node rank = completion index."""
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    nodes = int(trainer.get("numNodes", 1))
    resources = trainer.get("resourcesPerNode") or {}
    if "numProcPerNode" in trainer:
        nproc = str(trainer["numProcPerNode"])
    elif any("gpu" in k for part in resources.values() for k in part):
        nproc = "auto"
    else:
        cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get(
            "cpu"
        )
        nproc = str(max(1, cpu_count(cpu))) if cpu else "1"
    user_env = container_env(trainer)
    return [
        {
            **POD_BASE_ENV,
            **user_env,
            "PET_NNODES": str(nodes),
            "PET_NPROC_PER_NODE": nproc,
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
            "PET_MASTER_PORT": "29500",
        }
        for index in range(nodes)
    ]


def indexedjob_pods(job: dict) -> list[dict[str, str]]:
    """batch/v1 Indexed Job: the Job controller adds JOB_COMPLETION_INDEX; the rest is the
    container env written in the manifest."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return [
        {**POD_BASE_ENV, **container_env(container), "JOB_COMPLETION_INDEX": str(index)}
        for index in range(int(job["spec"]["completions"]))
    ]


def container_args(job: dict) -> list[str]:
    if job["kind"] == "TrainJob":
        return job["spec"]["trainer"]["args"]
    if job["kind"] == "PyTorchJob":
        replica = next(iter(job["spec"]["pytorchReplicaSpecs"].values()))
        return replica["template"]["spec"]["containers"][0]["args"]
    return job["spec"]["template"]["spec"]["containers"][0]["args"]


POD_ENVS = {"PyTorchJob": pytorchjob_pods, "TrainJob": trainjob_pods, "Job": indexedjob_pods}


class Case(NamedTuple):
    argv: tuple[str, ...]  # `kubeddp render` arguments
    elastic: tuple[int, int] | None = None
    nproc: int | None = None  # processes per pod when the options fix it


JOBS = {
    # nprocPerNode auto on CPU: the operator counts 1 per pod in WORLD_SIZE (the slow case:
    # launch imports torch to count GPUs).
    "pytorchjob-cpu-auto": pytest.param(
        Case(("pytorchjob", "--name", "pt", "--nodes", "2", "--cpu", "2")),
        marks=pytest.mark.slow,
    ),
    "pytorchjob-cpu-3": Case(
        ("pytorchjob", "--name", "pt3", "--nodes", "3", "--nproc-per-node", "1"), nproc=1
    ),
    "pytorchjob-gpu-2x8": Case(
        ("pytorchjob", "--name", "ptg", "--nodes", "2", "--gpus-per-node", "8"), nproc=8
    ),
    "pytorchjob-single": Case(
        ("pytorchjob", "--name", "one", "--nodes", "1", "--nproc-per-node", "4"), nproc=4
    ),
    "pytorchjob-master-3": Case(
        (
            "pytorchjob",
            "--name",
            "ptm",
            "--nodes",
            "3",
            "--nproc-per-node",
            "2",
            "--master-replica",
        ),
        nproc=2,
    ),  # fmt: skip
    "pytorchjob-elastic": Case(
        ("pytorchjob", "--name", "el", "--elastic", "2:4", "--nproc-per-node", "2"),
        elastic=(2, 4),
        nproc=2,
    ),
    "trainjob-cpu-2": Case(("trainjob", "--name", "tj", "--nodes", "2", "--cpu", "2")),
    "trainjob-gpu-3x4": Case(
        ("trainjob", "--name", "tjg", "--nodes", "3", "--gpus-per-node", "4"), nproc=4
    ),
    "indexedjob-3x2": Case(
        ("indexedjob", "--name", "ix", "--nodes", "3", "--nproc-per-node", "2"), nproc=2
    ),
}


def dry_run(env: dict[str, str], args: list[str], monkeypatch, capsys) -> dict:
    """`kubeddp launch --dry-run ARGS` with the pod's env and nothing else of this machine's, in
    this process (tests/helpers/cli.py): a plan needs no process of its own."""
    result = cli.run(["launch", "--dry-run", *args], monkeypatch, capsys, env)
    assert result.returncode == 0, f"env {env}: {result.stderr}"
    return json.loads(result.stdout)


def _params():
    for case_id, case in JOBS.items():
        if isinstance(case, Case):
            yield pytest.param(case, id=case_id)
        else:
            yield pytest.param(*case.values, marks=case.marks, id=case_id)


@pytest.mark.parametrize("case", list(_params()))
def test_every_pod_agrees_on_the_rendezvous(case: Case, monkeypatch, capsys):
    job = job_of(*case.argv)
    pods = POD_ENVS[job["kind"]](job)
    args = container_args(job)
    plans = [dry_run(env, args, monkeypatch, capsys) for env in pods]
    assert len({p["nnodes"] for p in plans}) == 1
    assert len({p["rdzv_endpoint"] for p in plans}) == 1
    assert len({p["world_size"] for p in plans}) == 1
    assert len({p["nproc_per_node"] for p in plans}) == 1
    assert all(p["in_kubernetes"] for p in plans)
    for env, plan in zip(pods, plans, strict=True):
        if "WORLD_SIZE" in env:  # the operator's own count must match what torchrun will use
            assert plan["world_size"] == int(env["WORLD_SIZE"]), env
    # launch takes the config options; its workers get the config in their environment
    assert all(p["argv"][-2:] == ["--module", "kubeddp.trainer.worker"] for p in plans)
    if case.elastic:
        low, high = case.elastic
        assert plans[0]["nnodes"] == f"{low}:{high}"
        assert plans[0]["rdzv_backend"] == "c10d"
        assert plans[0]["rdzv_endpoint"] == f"{job['metadata']['name']}-worker-0:23456"
        return
    nodes = len(pods)
    assert plans[0]["nnodes"] == str(nodes)
    assert sorted(p["node_rank"] for p in plans) == list(range(nodes))
    assert plans[0]["world_size"] == nodes * plans[0]["nproc_per_node"]
    if case.nproc:
        assert plans[0]["nproc_per_node"] == case.nproc
