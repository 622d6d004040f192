"""`kubeddp launch --dry-run` as a user or a pod runs it: the JSON plan, and one-line errors.

Each case runs the command with a controlled environment (nothing of this machine's env leaks in
but PATH/HOME); KUBEDDP_DRY_RUN_GPUS pretends that many GPUs exist. The cases run kubeddp's main
in this process (tests/helpers/cli.py); one runs the command as a process too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import cli
from tests.helpers.pod_env import (
    elastic_pod,
    indexedjob_pod,
    pytorchjob_pod,
    torchrun_worker_env,
    trainjob_pod,
)

pytestmark = pytest.mark.timeout(60)

SOURCES = {
    "torchrun",
    "pytorchjob",
    "pytorchjob-elastic",
    "trainjob",
    "env",
    "indexedjob",
    "standalone",
}
PLAN_KEYS = {
    "source",
    "nnodes",
    "nproc_per_node",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "world_size",
    "argv",
}


def launch_process(env: dict[str, str], *args: str, gpus: int = 0) -> subprocess.CompletedProcess:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH") if k in os.environ}
    full_env = {**base, "KUBEDDP_DRY_RUN_GPUS": str(gpus), **env}
    return subprocess.run(
        [sys.executable, "-m", "kubeddp", "launch", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=45,
    )


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    def run(env: dict[str, str], *args: str, gpus: int = 0) -> subprocess.CompletedProcess:
        full_env = {"KUBEDDP_DRY_RUN_GPUS": str(gpus), **env}
        return cli.run(["launch", *args], monkeypatch, capsys, full_env)

    return run


def planned(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def check_plan_types(plan: dict) -> None:
    assert set(plan) >= PLAN_KEYS, f"missing {PLAN_KEYS - set(plan)}"
    assert plan["source"] in SOURCES
    assert isinstance(plan["nnodes"], str) and re.fullmatch(r"\d+(:\d+)?", plan["nnodes"])
    assert type(plan["nproc_per_node"]) is int and plan["nproc_per_node"] >= 1
    assert isinstance(plan["rdzv_backend"], str) and plan["rdzv_backend"]
    assert re.fullmatch(r"[A-Za-z0-9.\-]+:\d+", plan["rdzv_endpoint"]), plan["rdzv_endpoint"]
    assert isinstance(plan["argv"], list) and all(isinstance(a, str) for a in plan["argv"])
    if plan["source"] == "pytorchjob-elastic":
        assert plan["node_rank"] is None and plan["world_size"] is None
        assert ":" in plan["nnodes"]
    else:
        assert type(plan["node_rank"]) is int and type(plan["world_size"]) is int
        assert ":" not in plan["nnodes"]


CASES = {
    "torchrun": (torchrun_worker_env(), 0),
    "pytorchjob": (pytorchjob_pod("Worker", 0, 1, "auto"), 2),
    "pytorchjob-elastic": (elastic_pod({"PET_RDZV_ID": "x"}), 0),
    "trainjob": (trainjob_pod(1), 0),
    "env": ({"MASTER_ADDR": "m", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}, 0),
    "indexedjob": (indexedjob_pod(1), 0),
    "standalone": ({}, 0),
}


@pytest.mark.parametrize("source", sorted(CASES))
def test_dry_run_json_keys_and_types(launch, source) -> None:
    env, gpus = CASES[source]
    plan = planned(
        launch(env, "--dry-run", "--", "--config", "/etc/kubeddp/config.yaml", gpus=gpus)
    )
    check_plan_types(plan)
    assert plan["source"] == source
    assert plan["argv"][-1] == "kubeddp.trainer.worker"  # the config: in the workers' env


def test_dry_run_pytorchjob_worker_with_gpus() -> None:
    """As a pod runs it: the command as its own process."""
    plan = planned(launch_process(pytorchjob_pod("Worker", 0, 1, "auto"), "--dry-run", gpus=2))
    assert plan["nproc_per_node"] == 2 and plan["node_rank"] == 1 and plan["world_size"] == 4
    assert plan["argv"][0] == "torchrun"
    assert "--nproc-per-node=2" in plan["argv"]


def test_dry_run_auto_on_cpu_node_is_one_worker(launch) -> None:
    plan = planned(launch(pytorchjob_pod("Master", 0, 3, "auto"), "--dry-run"))
    assert plan["nproc_per_node"] == 1 and plan["world_size"] == 4


def test_dry_run_flags_reach_the_plan(launch) -> None:
    plan = planned(launch({}, "--dry-run", "--nproc-per-node", "3", "--max-restarts", "2"))
    assert plan["nproc_per_node"] == 3 and plan["world_size"] == 3
    assert "--max-restarts=2" in plan["argv"]


ERRORS = {
    "rank >= world size": (
        {**pytorchjob_pod("Worker", 0, 1, "1"), "RANK": "2", "PET_NODE_RANK": "2"},
        ("RANK=2", "WORLD_SIZE=2"),
    ),
    "world size not multiple of nodes": (
        {**pytorchjob_pod("Master", 0, 2, "1"), "WORLD_SIZE": "4"},
        ("WORLD_SIZE=4", "PET_NNODES=3"),
    ),
    "non-numeric": (
        {**trainjob_pod(0), "PET_NNODES": "two"},
        ("PET_NNODES='two'", "whole number"),
    ),
    "worker without master": (
        {k: v for k, v in pytorchjob_pod("Worker", 0, 1, "1").items() if "MASTER" not in k},
        ("MASTER_ADDR", "KUBEDDP_NODE_RANK", "Master replica"),
    ),
    "dry-run gpus not a number": (
        {"KUBEDDP_DRY_RUN_GPUS": "some"},
        ("KUBEDDP_DRY_RUN_GPUS='some'",),
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_inconsistent_env_exits_with_one_line(launch, case) -> None:
    env, mentions = ERRORS[case]
    done = launch(env, "--dry-run")
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("kubeddp launch: error: ")
    for word in mentions:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
