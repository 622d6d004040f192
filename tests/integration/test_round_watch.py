"""A pod whose workers never hear that a peer was lost still rejoins (launcher/round_watch.py).

Two real Indexed-Job "pods" (kubeddp launch processes with the env the chart gives, on
loopback, each with its own memory for snapshots). Pod 0's worker waits in its data loader in
the first round: outside any collective, so no failed collective ever reaches it (as a worker
waiting in a store or a subgroup's set-up at start-up). Pod 1 is then lost whole (SIGKILL of
its launcher and worker) and started again with empty memory, as the Job controller recreates
a lost pod on another node. Its arrival for the next round is what pod 0 sees: it stops its
worker, rejoins, sends pod 1 its snapshot, and both finish. Before the watch, pod 0 waited
until its stall watch ended it (3 minutes), and the new pod 1 waited out its round.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kubeddp.trainer import constants
from tests.helpers import faults, procs
from tests.helpers.pod_env import loopback_indexedjob_pod
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
RUN_SECONDS = 200
SLEEP_AT_STEP = 6  # pod 0's worker stops in its data loader there, after snapshots at 2 and 4
STEPS = 16


def pod_env(index: int, port: int, memory: Path) -> dict[str, str]:
    """An Indexed Job pod of a 2-node job, as `kubeddp render indexedjob` writes it."""
    return procs.child_env({
        **loopback_indexedjob_pod(index, port),
        constants.ENV_RDZV_WAIT_SECONDS: "120",  # both start together here; a loaded machine
        constants.ENV_SNAPSHOT_DIR: str(memory),  # each pod's own memory volume
    })  # fmt: skip


def launch_argv(checkpoints: Path) -> list[str]:
    sleep = faults.settings("sleep_data", 0, SLEEP_AT_STEP, samples=2048, batch_size=16,
                            first_group_only=True)  # fmt: skip
    return procs.kubeddp_argv(
        "launch", "--", *sleep,
        "--set", "train.batch_size=16", "--set", f"train.max_steps={STEPS}",
        "--set", "train.log_every=1", "--set", "ddp.backend=gloo", "--set", "ddp.device=cpu",
        "--set", "metrics.enabled=false", "--set", f"checkpoint.dir={checkpoints}",
        "--set", "checkpoint.memory_every_steps=2",
        # the stopped worker saves within this (it has nothing to save: it waits for data)
        "--set", "checkpoint.preempt_grace_seconds=5",
    )  # fmt: skip


def test_a_pod_whose_worker_never_saw_its_peer_lost_rejoins_when_the_peer_returns(
    tmp_path: Path,
) -> None:
    checkpoints, port = tmp_path / "checkpoints", free_port()
    argv = launch_argv(checkpoints)
    with procs.started(argv, tmp_path / "pod0.log", pod_env(0, port, tmp_path / "mem0")) as pod0:
        with procs.started(argv, tmp_path / "pod1-a.log",
                           pod_env(1, port, tmp_path / "mem1-a")) as lost:  # fmt: skip
            # pod 0 logged its last step before the one it waits for: both are stuck now
            pod0.wait_for_output(rf"^step {SLEEP_AT_STEP - 1}/", RUN_SECONDS)
            lost.kill()
        recreated_env = pod_env(1, port, tmp_path / "mem1-b")  # a new node: empty memory
        with procs.started(argv, tmp_path / "pod1-b.log", recreated_env) as pod1:
            codes = (pod0.wait(RUN_SECONDS), pod1.wait(RUN_SECONDS))
            assert codes == (0, 0), f"{codes}\n{pod0.tail()}\n{pod1.tail()}"
    out0, out1 = pod0.output(), pod1.output()
    assert "a pod left rendezvous round 0 (1 arrived for round 1)" in out0, out0[-3000:]
    assert "this pod stays up and rejoins" in out0, out0[-3000:]
    resumed = re.findall(r"resumed from memory://\S+/rank-0 \(step (\d+)", out0)
    assert resumed and int(resumed[-1]) >= SLEEP_AT_STEP - 2, out0[-3000:]  # no storage read
    assert "received it from rank 0" in out1, out1[-3000:]
    assert f"done: {STEPS} steps" in out0, out0[-3000:]
