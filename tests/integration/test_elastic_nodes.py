"""Elastic recovery across two nodes (network namespaces) with the env of an elastic PyTorchJob:
one node is lost mid-run (its whole process tree SIGKILLed), the survivor re-forms the group
alone and resumes from its own memory (a snapshot every step: never older than the newest
checkpoint), the lost node comes back and is sent that state, the group re-forms at two, and
the job completes with every sample of every epoch trained exactly once although the world size
went 2 -> 1 -> 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kubeddp.trainer import constants
from tests.helpers import checkpoints as ck
from tests.helpers import netns, procs, workloads

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(300)]

JOB = "kddp-elastic"


def node_env() -> dict[str, str]:
    """What the training operator injects into every pod of an elasticPolicy job."""
    return procs.child_env(
        {
            "PET_NNODES": "1:2",
            "PET_RDZV_ENDPOINT": f"{JOB}-worker-0:{constants.PYTORCHJOB_PORT}",
            "PET_RDZV_BACKEND": "c10d",
            "PET_MAX_RESTARTS": "3",
            "PET_NPROC_PER_NODE": "1",
            # rdzvConf of the job: a short last call and heartbeat keep the test short.
            "PET_RDZV_CONF": "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3",
            workloads.DELAY_ENV: "0.02",  # 0.32 s per step: time to lose and restart a node
        }
    )


def _groups(pod0: procs.Proc, pod1: procs.Proc, size: int) -> int:
    """How many worker groups of `size` have started (rank 0 prints one line per group)."""
    return sum(p.output().count(f"world size {size} (gloo") for p in (pod0, pod1))


def test_lost_node_comes_back_and_the_job_completes(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "shared-pvc"  # both nodes see the host's filesystem
    settings = ck.scenario_settings(ckpt_dir, "checkpoint.memory_every_steps=1")
    argv = procs.kubeddp_argv("launch", "--", *settings)
    env = node_env()
    nodes = netns.cluster([f"{JOB}-worker-0", f"{JOB}-worker-1"])
    with nodes as (node0, node1), procs.started(node0.wrap(argv), tmp_path / "0.log", env) as pod0:
        with procs.started(node1.wrap(argv), tmp_path / "1.log", env) as pod1:
            # min is 1: a node that starts late makes a group of one first; wait for two.
            procs.wait_until(lambda: _groups(pod0, pod1, 2), 150, "a group of two", pod0)
            before = set(ck.steps(ckpt_dir))
            procs.wait_until(lambda: set(ck.steps(ckpt_dir)) - before, 60, "its checkpoint", pod0)
            alone = _groups(pod0, pod1, 1)
            pod1.kill()  # the node is gone: agent and worker, no chance to save
        procs.wait_until(lambda: _groups(pod0, pod1, 1) > alone, 120, "a group of one", pod0)
        with procs.started(node1.wrap(argv), tmp_path / "1-back.log", env) as pod1:
            code0 = pod0.wait(200)
            code1 = pod1.wait(60)
    logs = pod0.output() + pod1.output()
    assert code0 == 0 and code1 == 0, pod0.tail() + "\n" + pod1.tail()
    sizes = [int(s) for s in re.findall(r"world size (\d+) \(gloo", logs)]
    assert 1 in sizes and sizes[-1] == 2, f"world sizes seen: {sizes}"
    assert "resumed from memory://" in logs, pod0.tail()
    final = ck.newest_state(ckpt_dir)
    assert final["world_size"] == 2
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
