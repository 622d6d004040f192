"""Every way a pod is launched, planned from the exact env the operators inject.

The env of each pod (tests/helpers/pod_env.py) is written out by hand from the operators' env
table (tests/emulation/operator_table.csv; job `demo`, in a pod: the kubelet adds
KUBERNETES_SERVICE_HOST); `test_fixtures_match_csv` checks the variable names against it so a
fixture cannot drift from the operators.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from kubeddp.trainer.launcher.agent import WORKER_MODULE
from kubeddp.trainer.launcher.rendezvous import (
    RendezvousError,
    detect_source,
    plan_from_env,
    resolve_nproc,
)
from tests.helpers.pod_env import (
    POD,
    elastic_pod,
    indexedjob_pod,
    pytorchjob_pod,
    torchrun_worker_env,
    trainjob_pod,
    workers_pod,
)

pytestmark = pytest.mark.timeout(30)

# The project's table of what the operators inject (rows cite upstream; checked against the
# reference kubeflow-env-matrix.csv in tests/emulation/test_operator_env.py).
MATRIX = Path(__file__).resolve().parents[1] / "emulation" / "operator_table.csv"
WORKER_ARGS = ["--config", "/etc/kubeddp/config.yaml"]
NO_GPU = lambda: 0  # noqa: E731
FOUR_GPUS = lambda: 4  # noqa: E731


def plan(env: dict[str, str], gpus=NO_GPU, **kwargs):
    return plan_from_env(env, WORKER_ARGS, gpu_count=gpus, **kwargs)


def flag(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} appears {len(values)} times in {argv}"
    return values[0]


def test_fixtures_match_csv() -> None:
    rows = list(csv.DictReader(MATRIX.open()))

    def names(api: str, *conditions: str) -> set[str]:
        return {
            r["env_var"]
            for r in rows
            if api in r["api"] and r["condition"] in conditions and "/" not in r["env_var"]
        }

    master = names(
        "PyTorchJob",
        "always",
        "Master replica present",
        "elasticPolicy == nil",
        'spec.nprocPerNode set (defaulted to "auto" unless elasticPolicy.nProcPerNode set)',
    )
    assert set(pytorchjob_pod("Worker", 0, 1, "2")) - set(POD) == master
    workers_only = names(
        "PyTorchJob",
        "always",
        "elasticPolicy == nil",
        'spec.nprocPerNode set (defaulted to "auto" unless elasticPolicy.nProcPerNode set)',
    )
    assert {k for k in workers_pod(0) if not k.startswith("KUBEDDP_")} - set(POD) == workers_only
    elastic = names(
        "PyTorchJob",
        "always",
        "elasticPolicy != nil",
        'spec.nprocPerNode set (defaulted to "auto" unless elasticPolicy.nProcPerNode set)',
    )
    assert set(elastic_pod()) - set(POD) == elastic
    optional = {"PET_RDZV_ID", "PET_MAX_RESTARTS", "PET_RDZV_CONF"}
    assert optional <= names("PyTorchJob", *{r["condition"] for r in rows})
    trainjob = names("TrainJob", "trainJob.spec.trainer != nil", "command != torchtune entrypoint")
    assert set(trainjob_pod(0)) - set(POD) == trainjob


# ---- PyTorchJob v1 with a Master -----------------------------------------------------------


@pytest.mark.parametrize("replica,index,node_rank", [("Master", 0, 0), ("Worker", 0, 1)])
@pytest.mark.parametrize("nproc,gpus,expected_nproc", [("1", 0, 1), ("2", 0, 2), ("auto", 4, 4)])
def test_pytorchjob_master_and_worker(replica, index, node_rank, nproc, gpus, expected_nproc):
    p = plan(pytorchjob_pod(replica, index, workers=1, nproc=nproc), gpus=lambda: gpus)
    assert p.source == "pytorchjob"
    assert p.nnodes == "2"
    assert p.node_rank == node_rank  # RANK is the node rank, not a process rank
    assert p.nproc_per_node == expected_nproc
    assert p.world_size == 2 * expected_nproc
    assert p.rdzv_backend == "static"
    assert p.rdzv_endpoint == "demo-master-0:23456"
    assert p.in_kubernetes
    assert p.argv[0] == "torchrun"
    assert flag(p.argv, "nnodes") == "2"
    assert flag(p.argv, "node-rank") == str(node_rank)
    assert flag(p.argv, "nproc-per-node") == str(expected_nproc)
    assert flag(p.argv, "master-addr") == "demo-master-0"
    assert flag(p.argv, "master-port") == "23456"
    assert p.argv[-4:] == ["--module", WORKER_MODULE, *WORKER_ARGS]


def test_pytorchjob_second_worker_of_three_nodes() -> None:
    p = plan(pytorchjob_pod("Worker", 1, workers=2, nproc="2"))
    assert (p.nnodes, p.node_rank, p.world_size) == ("3", 2, 6)


@pytest.mark.parametrize("nproc", ["auto", "cpu"])
def test_auto_on_cpu_node_is_one_worker_not_one_per_core(nproc) -> None:
    p = plan(pytorchjob_pod("Master", 0, workers=1, nproc=nproc))
    assert p.nproc_per_node == 1
    assert flag(p.argv, "nproc-per-node") == "1"
    assert p.world_size == 2


def test_cpu_nproc_env_sets_workers_on_cpu_node() -> None:
    env = {**pytorchjob_pod("Master", 0, workers=1, nproc="auto"), "KUBEDDP_CPU_NPROC": "3"}
    assert plan(env).nproc_per_node == 3
    # With GPUs visible, auto means one worker per GPU whatever KUBEDDP_CPU_NPROC says.
    assert plan(env, gpus=FOUR_GPUS).nproc_per_node == 4


def test_nproc_flag_overrides_env() -> None:
    p = plan(pytorchjob_pod("Master", 0, workers=1, nproc="auto"), nproc_flag="2")
    assert (p.nproc_per_node, p.world_size) == (2, 4)


def test_max_restarts_flag() -> None:
    p = plan(pytorchjob_pod("Master", 0, workers=1, nproc="1"), max_restarts=2)
    assert flag(p.argv, "max-restarts") == "2"


# ---- PyTorchJob v1, Workers only (kubeddp's default static shape) --------------------------


@pytest.mark.parametrize("index", [0, 2])
@pytest.mark.parametrize("nproc,gpus,expected_nproc", [("1", 0, 1), ("auto", 0, 1), ("auto", 4, 4)])
def test_pytorchjob_workers_only(index, nproc, gpus, expected_nproc) -> None:
    p = plan(workers_pod(index, workers=3, nproc=nproc), gpus=lambda: gpus)
    assert p.source == "pytorchjob-workers"
    assert (p.nnodes, p.node_rank, p.nproc_per_node) == ("3", index, expected_nproc)
    assert p.world_size == 3 * expected_nproc
    assert (p.rdzv_backend, p.rdzv_endpoint) == ("static", "demo-worker-0:23456")
    assert flag(p.argv, "node-rank") == str(index)
    assert flag(p.argv, "master-addr") == "demo-worker-0"
    assert flag(p.argv, "nproc-per-node") == str(expected_nproc)


# ---- elastic PyTorchJob ------------------------------------------------------------------


def test_elastic_minimal() -> None:
    p = plan(elastic_pod())
    assert p.source == "pytorchjob-elastic"
    assert p.nnodes == "1:3"
    assert p.node_rank is None and p.world_size is None
    assert p.rdzv_backend == "c10d"
    assert p.rdzv_endpoint == "demo-worker-0:23456"
    assert p.nproc_per_node == 1
    assert p.rdzv_id == "demo"  # every pod derives the same id from the job name
    assert flag(p.argv, "nnodes") == "1:3"
    assert flag(p.argv, "rdzv-backend") == "c10d"
    assert flag(p.argv, "rdzv-endpoint") == "demo-worker-0:23456"
    assert flag(p.argv, "rdzv-id") == "demo"
    assert not [a for a in p.argv if a.startswith(("--node-rank", "--master-addr", "--rdzv-conf"))]


def test_elastic_with_id_restarts_and_conf() -> None:
    extra = {
        "PET_RDZV_ID": "run-7",
        "PET_MAX_RESTARTS": "5",
        "PET_RDZV_CONF": "join_timeout=900,read_timeout=120",
    }
    p = plan(elastic_pod(extra))
    assert (p.rdzv_id, p.max_restarts) == ("run-7", 5)
    assert flag(p.argv, "rdzv-id") == "run-7"
    assert flag(p.argv, "max-restarts") == "5"
    assert flag(p.argv, "rdzv-conf") == "join_timeout=900,read_timeout=120"


def test_elastic_with_master_replica_is_still_elastic() -> None:
    env = {**pytorchjob_pod("Worker", 0, workers=2, nproc="auto"), **elastic_pod()}
    assert plan(env).source == "pytorchjob-elastic"


def test_elastic_gpus() -> None:
    assert plan(elastic_pod(), gpus=FOUR_GPUS).nproc_per_node == 4


# ---- TrainJob, plain env, Indexed Job, torchrun, standalone --------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_trainjob(rank) -> None:
    p = plan(trainjob_pod(rank, nproc="2"))
    assert p.source == "trainjob"
    assert (p.nnodes, p.node_rank, p.nproc_per_node, p.world_size) == ("2", rank, 2, 4)
    assert p.rdzv_backend == "static"
    assert p.rdzv_endpoint == "demo-node-0-0.demo:29500"
    assert flag(p.argv, "master-addr") == "demo-node-0-0.demo"


def test_trainjob_auto_on_gpu_node() -> None:
    assert plan(trainjob_pod(0), gpus=FOUR_GPUS).nproc_per_node == 4
    assert plan(trainjob_pod(0)).nproc_per_node == 1


def test_plain_env_one_process_per_pod() -> None:
    env = {"MASTER_ADDR": "trainer-0", "MASTER_PORT": "29400", "RANK": "2", "WORLD_SIZE": "3"}
    p = plan(env, gpus=FOUR_GPUS)
    assert p.source == "env"
    assert (p.nnodes, p.node_rank, p.nproc_per_node, p.world_size) == ("3", 2, 1, 3)
    assert p.rdzv_endpoint == "trainer-0:29400"
    assert not p.in_kubernetes


@pytest.mark.parametrize("index", [0, 1])
def test_indexed_job(index) -> None:
    p = plan(indexedjob_pod(index))
    assert p.source == "indexedjob"
    assert (p.nnodes, p.node_rank, p.nproc_per_node, p.world_size) == ("2", index, 1, 2)
    assert p.rdzv_endpoint == "demo-0.demo:29500"
    assert p.rdzv_backend == "static"


def test_already_under_torchrun_runs_the_worker_directly() -> None:
    p = plan(torchrun_worker_env())
    assert p.source == "torchrun"
    assert (p.nnodes, p.node_rank, p.nproc_per_node, p.world_size) == ("2", 1, 2, 4)
    assert p.argv[1:] == ["-m", WORKER_MODULE, *WORKER_ARGS]
    assert not p.wait_for_host


def test_torchrun_inside_pytorchjob_pod() -> None:
    env = {**pytorchjob_pod("Worker", 0, workers=1, nproc="2"), **torchrun_worker_env()}
    assert plan(env).source == "torchrun"


@pytest.mark.parametrize("gpus,cpu_nproc,expected", [(0, None, 1), (2, None, 2), (0, "2", 2)])
def test_standalone(gpus, cpu_nproc, expected) -> None:
    env = {"KUBEDDP_CPU_NPROC": cpu_nproc} if cpu_nproc else {}
    p = plan(env, gpus=lambda: gpus)
    assert p.source == "standalone"
    assert (p.nnodes, p.node_rank, p.nproc_per_node, p.world_size) == ("1", 0, expected, expected)
    assert "--standalone" in p.argv
    assert not p.wait_for_host


def test_every_source_is_reachable() -> None:
    envs = [
        torchrun_worker_env(),
        pytorchjob_pod("Master", 0, 1, "1"),
        workers_pod(1),
        elastic_pod(),
        trainjob_pod(0),
        {"MASTER_ADDR": "a", "MASTER_PORT": "1", "RANK": "0", "WORLD_SIZE": "1"},
        indexedjob_pod(0),
        {},
    ]
    assert [detect_source(e) for e in envs] == [
        "torchrun",
        "pytorchjob",
        "pytorchjob-workers",
        "pytorchjob-elastic",
        "trainjob",
        "env",
        "indexedjob",
        "standalone",
    ]


# ---- inconsistent env: one line naming the variables and the fix ---------------------------


def _without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


BAD_ENVS = {
    "rank >= world size": (
        {**pytorchjob_pod("Worker", 0, 1, "1"), "RANK": "2", "PET_NODE_RANK": "2"},
        ["RANK", "WORLD_SIZE"],
    ),
    "world size not a multiple of nodes": (
        {**pytorchjob_pod("Master", 0, 1, "1"), "WORLD_SIZE": "3"},
        ["WORLD_SIZE", "PET_NNODES"],
    ),
    "non-numeric world size": (
        {**pytorchjob_pod("Master", 0, 1, "1"), "WORLD_SIZE": "two"},
        ["WORLD_SIZE", "'two'"],
    ),
    "non-numeric port": (
        {**pytorchjob_pod("Master", 0, 1, "1"), "MASTER_PORT": "http"},
        ["MASTER_PORT", "'http'"],
    ),
    "worker without master address": (
        _without(pytorchjob_pod("Worker", 0, 1, "1"), "MASTER_ADDR", "PET_MASTER_ADDR"),
        ["MASTER_ADDR", "Master"],
    ),
    "rank/world size without master": (
        {"RANK": "1", "WORLD_SIZE": "2"},
        ["MASTER_ADDR", "RANK"],
    ),
    "plain env without port": (
        {"MASTER_ADDR": "a", "RANK": "0", "WORLD_SIZE": "2"},
        ["MASTER_PORT"],
    ),
    "trainjob rank past nodes": (
        trainjob_pod(2),
        ["PET_NODE_RANK", "PET_NNODES"],
    ),
    "indexed job index past nodes": (
        indexedjob_pod(5),
        ["JOB_COMPLETION_INDEX", "KUBEDDP_NNODES"],
    ),
    "indexed job without node count": (
        _without(indexedjob_pod(0), "KUBEDDP_NNODES"),
        ["KUBEDDP_NNODES", "kubeddp render indexedjob"],
    ),
    "workers scaled after rendering": (
        {**workers_pod(0), "PET_NNODES": "5"},
        ["KUBEDDP_NNODES=3", "PET_NNODES=5", "render it again"],
    ),
    "workers rank past nodes": (
        workers_pod(3),
        ["KUBEDDP_NODE_RANK=3", "KUBEDDP_NNODES=3"],
    ),
    "kubeddp master without a node rank": (
        _without(workers_pod(0), "KUBEDDP_NODE_RANK"),
        ["KUBEDDP_MASTER_ADDR", "KUBEDDP_NODE_RANK", "JOB_COMPLETION_INDEX"],
    ),
    "elastic endpoint without port": (
        elastic_pod({"PET_RDZV_ENDPOINT": "demo-worker-0"}),
        ["PET_RDZV_ENDPOINT", "host:port"],
    ),
    "elastic min above max": (
        elastic_pod({"PET_NNODES": "3:1"}),
        ["PET_NNODES", "MIN:MAX"],
    ),
    "bad nproc": (
        pytorchjob_pod("Master", 0, 1, "many"),
        ["PET_NPROC_PER_NODE", "'many'"],
    ),
    "gpu nproc without gpu": (
        trainjob_pod(0, nproc="gpu"),
        ["PET_NPROC_PER_NODE=gpu", "nvidia.com/gpu"],
    ),
    "bad cpu nproc": (
        {"KUBEDDP_CPU_NPROC": "lots"},
        ["KUBEDDP_CPU_NPROC", "'lots'"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ENVS))
def test_inconsistent_env_is_one_line_naming_the_variables(case) -> None:
    env, mentions = BAD_ENVS[case]
    with pytest.raises(RendezvousError) as err:
        plan(env)
    message = str(err.value)
    assert "\n" not in message
    for word in mentions:
        assert word in message, f"{case}: {word!r} not in {message!r}"


def test_resolve_nproc_rejects_zero() -> None:
    with pytest.raises(RendezvousError, match="--nproc-per-node=0 must be >= 1"):
        resolve_nproc("0", "--nproc-per-node", {}, NO_GPU)
