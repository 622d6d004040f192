"""The env of a pod of each kind, written out by hand from the operators' env table
(tests/emulation/operator_table.csv; job `demo`, in a pod: the kubelet adds
KUBERNETES_SERVICE_HOST). tests/unit/test_rendezvous.py checks the names against that table."""

from __future__ import annotations

POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def pytorchjob_pod(replica: str, index: int, workers: int, nproc: str) -> dict[str, str]:
    """A PyTorchJob v1 pod (Master replicas 1 + `workers` Workers, no elasticPolicy)."""
    nodes = 1 + workers
    rank = index if replica == "Master" else index + 1
    per_node = int(nproc) if nproc.isdigit() else 1  # auto/cpu/gpu count as 1 in WORLD_SIZE
    return {
        **POD,
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": "demo-master-0",
        "PET_MASTER_ADDR": "demo-master-0",
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "WORLD_SIZE": str(nodes * per_node),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NNODES": str(nodes),
    }


def workers_pod(index: int, workers: int = 3, nproc: str = "auto") -> dict[str, str]:
    """A Worker-only PyTorchJob v1 pod without elasticPolicy, as `kubeddp render pytorchjob`
    writes it: the operator adds PYTHONUNBUFFERED, PET_NNODES and PET_NPROC_PER_NODE only (no
    Master: no MASTER_*/RANK/WORLD_SIZE); the manifest adds KUBEDDP_*, the node rank from the
    pod's replica-index label."""
    return {
        **POD,
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": nproc,
        "PET_NNODES": str(workers),
        "KUBEDDP_MASTER_ADDR": "demo-worker-0",
        "KUBEDDP_MASTER_PORT": "23456",
        "KUBEDDP_NNODES": str(workers),
        "KUBEDDP_NODE_RANK": str(index),
    }


def elastic_pod(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A Worker-only PyTorchJob v1 pod with elasticPolicy min 1, max 3 (no Master vars)."""
    return {
        **POD,
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": "auto",
        "PET_NNODES": "1:3",
        "PET_RDZV_ENDPOINT": "demo-worker-0:23456",
        "PET_RDZV_BACKEND": "c10d",
        **(extra or {}),
    }


def trainjob_pod(rank: int, nproc: str = "auto") -> dict[str, str]:
    """A TrainJob (Trainer v2, torch runtime) `node` container, numNodes 2."""
    return {
        **POD,
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": nproc,
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "demo-node-0-0.demo",
        "PET_MASTER_PORT": "29500",
    }


def indexedjob_pod(index: int, nproc: str = "auto") -> dict[str, str]:
    """A pod of the Indexed Job `kubeddp render indexedjob` writes (2 nodes)."""
    return {
        **POD,
        "JOB_COMPLETION_INDEX": str(index),
        "KUBEDDP_MASTER_ADDR": "demo-0.demo",
        "KUBEDDP_MASTER_PORT": "29500",
        "KUBEDDP_NNODES": "2",
        "KUBEDDP_NPROC_PER_NODE": nproc,
    }


def loopback_indexedjob_pod(index: int, port: int) -> dict[str, str]:
    """indexedjob_pod with one worker, its rendezvous host on this machine: real pods as
    processes (tests/integration)."""
    loopback = {"KUBEDDP_MASTER_ADDR": "127.0.0.1", "KUBEDDP_MASTER_PORT": str(port)}
    return {**indexedjob_pod(index, "1"), **loopback}


def torchrun_worker_env() -> dict[str, str]:
    """What torchrun's agent sets for local rank 1 of node 1 in a 2 x 2 job."""
    return {
        "LOCAL_RANK": "1",
        "RANK": "3",
        "GROUP_RANK": "1",
        "ROLE_RANK": "3",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "4",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "demo-master-0",
        "MASTER_PORT": "23456",
        "TORCHELASTIC_RUN_ID": "demo",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }
