"""The emulated operators' rules on hand-written manifests (no processes, no root)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster import EmulatedCluster
from operator_env import (
    ManifestError,
    container_env,
    indexedjob_plan,
    pytorchjob_plan,
    trainjob_plan,
)


def _template(port: int | None = None, env: list | None = None) -> dict:
    container: dict = {"name": "pytorch", "image": "kubeddp:cpu", "env": env or []}
    if port:
        container["ports"] = [{"name": "pytorchjob-port", "containerPort": port}]
    return {"spec": {"containers": [container]}}


def _pytorchjob(spec_extra: dict, master: bool = True, workers: int = 2) -> dict:
    replicas = {"Worker": {"replicas": workers, "template": _template()}}
    if master:
        replicas["Master"] = {"replicas": 1, "template": _template(port=1234)}
    return {"metadata": {"name": "job"}, "spec": {"pytorchReplicaSpecs": replicas, **spec_extra}}


def test_pytorchjob_master_env_world_size_counts_auto_as_one() -> None:
    plan = pytorchjob_plan(_pytorchjob({}))
    assert [p.name for p in plan.pods] == ["job-master-0", "job-worker-0", "job-worker-1"]
    worker1 = plan.pods[2].operator_env
    assert worker1 == {
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": "job-master-0",
        "PET_MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "1234",  # the Master's pytorchjob-port
        "PET_MASTER_PORT": "1234",
        "WORLD_SIZE": "3",  # nprocPerNode defaults to auto, which counts as 1
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "auto",
        "RANK": "2",
        "PET_NODE_RANK": "2",
    }


def test_pytorchjob_world_size_multiplies_integer_nproc() -> None:
    plan = pytorchjob_plan(_pytorchjob({"nprocPerNode": "4"}))
    assert plan.pods[0].operator_env["WORLD_SIZE"] == "12"
    assert plan.pods[1].operator_env["RANK"] == "1"


def test_elastic_env_without_master() -> None:
    policy = {"minReplicas": 2, "rdzvBackend": "c10d", "maxRestarts": 5,
              "rdzvConf": [{"key": "join_timeout", "value": "60"}]}  # fmt: skip
    plan = pytorchjob_plan(_pytorchjob({"elasticPolicy": policy}, master=False, workers=3))
    env = plan.pods[1].operator_env
    assert env["PET_NNODES"] == "2:2"  # maxReplicas defaults to minReplicas
    assert env["PET_RDZV_ENDPOINT"] == "job-worker-0:23456"
    assert env["PET_MAX_RESTARTS"] == "5"
    assert env["PET_RDZV_CONF"] == "join_timeout=60"
    assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE"} & set(env)
    assert plan.elastic


def test_master_replicas_must_be_one() -> None:
    job = _pytorchjob({})
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(ManifestError, match="Master.replicas must be 1"):
        pytorchjob_plan(job)


def test_trainjob_uses_runtime_and_cpu_count_and_completion_index() -> None:
    job = {
        "metadata": {"name": "tj"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "args": ["--"],
                        "resourcesPerNode": {"requests": {"cpu": "1500m"}}},
        },
    }  # fmt: skip
    plan = trainjob_plan(job)
    pod = plan.pods[1]
    assert pod.name == "tj-node-0-1" and "tj-node-0-1.tj" in pod.dns_names
    assert "command" not in pod.container  # the v2.3 runtime has none: the image entrypoint
    env = container_env(pod, "default", "198.51.100.5")
    assert env["PET_NPROC_PER_NODE"] == "2"  # CPU requests rounded up
    assert env["PET_NODE_RANK"] == "1"  # from the completion-index annotation
    assert env["PET_MASTER_ADDR"] == "tj-node-0-0.tj"
    assert "MASTER_ADDR" not in env and "WORLD_SIZE" not in env


def test_indexed_job_resolves_field_refs_and_expands_vars() -> None:
    job = {
        "metadata": {"name": "ij"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "template": {"spec": {"subdomain": "svc", "containers": [{
                "name": "trainer",
                "env": [
                    {"name": "IDX", "valueFrom": {"fieldRef": {"fieldPath":
                        "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                    {"name": "ME", "value": "pod-$(IDX)"},
                ],
            }]}},
        },
    }  # fmt: skip
    plan = indexedjob_plan(job)
    env = container_env(plan.pods[1], "default", "198.51.100.5")
    assert env["IDX"] == "1" and env["ME"] == "pod-1" and env["JOB_COMPLETION_INDEX"] == "1"
    assert plan.pods[1].dns_names[-1] == "ij-1.svc"


def test_paths_in_args_are_rewritten_to_volume_dirs(tmp_path: Path) -> None:
    mounts = {"/etc/kubeddp": tmp_path / "cm", "/checkpoints": tmp_path / "ck"}
    rewrite = EmulatedCluster.rewrite_path
    assert rewrite("/etc/kubeddp/config.yaml", mounts) == f"{tmp_path}/cm/config.yaml"
    assert rewrite("checkpoint.dir=/checkpoints", mounts) == f"checkpoint.dir={tmp_path}/ck"
    assert rewrite("/checkpointsX", mounts) == "/checkpointsX"
