"""A lost pod resumes from a peer's memory, not from storage, with real processes.

Both runs use the resume scenario of tests/helpers/checkpoints.py with durable checkpoints only
at the end of each epoch, and are killed in the first epoch, before any durable checkpoint
exists: what they resume from can only be memory. Each must end bitwise equal to one
uninterrupted run, with every sample of every epoch trained exactly once.

- a laptop run (2 processes) killed whole (`kill -9` of the launcher and its workers) and
  started again as the user would: it resumes from its own /dev/shm;
- two nodes (network namespaces, one process each, each with its own snapshot directory as a
  pod has its own memory volume): node 1 kills itself as it starts a snapshot (the one before
  stays whole), so the nodes hold different newest steps and agree on node 0's; node 1 is
  killed while node 0 sends it the snapshot, and again after the last byte arrived but before
  its slot's meta is written; started once more with its memory gone, it gets the snapshot
  from node 0 and the job finishes. Node 0 stays up throughout
  (it rejoins each time).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from kubeddp.trainer.constants import ENV_SNAPSHOT_DIR, ENV_TEST_KILL_AT
from tests.helpers import checkpoints as ck
from tests.helpers import netns, procs, workloads

pytestmark = [pytest.mark.slow]
# 4 ms per sample = ~64 ms per step: the kills land mid-epoch
SLOW = {workloads.DELAY_ENV: "0.004"}
MEMORY_ONLY = ("checkpoint.every_steps=0", "checkpoint.every_seconds=0")
RESUMED = re.compile(r"resumed from memory://(\S+)/rank-(\d+) \(step (\d+)")
HOSTS = ["gpu-host-0", "gpu-host-1"]
EVERY_3 = "checkpoint.memory_every_steps=3"  # snapshots at steps 3, 6, 9, 12, ...: in epoch 0
KUBEDDP = str(Path(sys.executable).parent / "kubeddp")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("snapshots")


def _step_logged(proc: procs.Proc, at_least: int) -> bool:
    steps = [int(s) for s in re.findall(r"^step (\d+)/", proc.output(), re.MULTILINE)]
    return bool(steps) and max(steps) >= at_least


@pytest.mark.timeout(420)
def test_a_laptop_run_killed_whole_resumes_from_its_own_memory(work: Path) -> None:
    baseline = ck.baseline_state(work)
    ckpt_dir = work / "laptop"
    argv = ck.scenario_argv(ckpt_dir, *MEMORY_ONLY)
    env = procs.child_env(SLOW)
    with procs.started(argv, work / "laptop-1.log", env) as first:
        procs.wait_until(lambda: _step_logged(first, 20), 180, "step 20", first)
        first.kill()  # kill -9 of everything: the launcher cannot clean up
    assert not ck.steps(ckpt_dir), "no durable checkpoint may exist yet"
    done = procs.run(argv, work / "laptop-2.log", timeout=240, env=env)
    assert done.code == 0, done.output[-4000:]
    found = RESUMED.search(done.output)
    assert found, done.output[-4000:]
    # the auto cadence, logged at the second snapshot (the first is at step 2)
    chosen = re.search(r"in-memory snapshots: every (\d+) steps", first.output())
    every = int(chosen.group(1)) if chosen else 18
    assert int(found.group(3)) >= max(20 - every, 2), f"more than one interval ({every}) lost"
    final = ck.newest_state(ckpt_dir)
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)


def _node_argv(rank: int, ckpt_dir: Path) -> list[str]:
    return [
        KUBEDDP, "train", "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank),
        "--master-addr", HOSTS[0], "--master-port", "29531", "--set", "metrics.port=0",
        *ck.scenario_settings(ckpt_dir / f"node-{rank}", *MEMORY_ONLY, EVERY_3),
    ]  # fmt: skip


def _node_env(memory: Path, **extra: str) -> dict[str, str]:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return {**base, "PYTHONPATH": str(procs.REPO), "PYTHONUNBUFFERED": "1", **SLOW,
            ENV_SNAPSHOT_DIR: str(memory), **extra}  # fmt: skip


@pytest.mark.netns
@pytest.mark.timeout(900)
def test_a_node_that_lost_its_memory_gets_the_state_from_its_peer(work: Path) -> None:
    netns.require_root()
    baseline = ck.baseline_state(work)
    ckpt_dir = work / "nodes"
    memory = [work / "memory-0", work / "memory-1"]
    with netns.cluster(HOSTS) as nodes:
        node1 = lambda log, **extra: procs.started(  # noqa: E731
            nodes[1].wrap(_node_argv(1, ckpt_dir)), work / log, _node_env(memory[1], **extra)
        )
        with procs.started(nodes[0].wrap(_node_argv(0, ckpt_dir)), work / "node0.log",
                           _node_env(memory[0])) as zero:  # fmt: skip
            # 1. node 1 dies as it empties a slot for its 4th snapshot (step 12): it keeps its
            #    3rd, node 0 finishes its 4th before its worker leaves
            with node1("node1-a.log", **{ENV_TEST_KILL_AT: "snapshot-emptied:4"}) as one:
                assert one.wait(300) != 0, one.tail()
            # 2. started again, it holds an older step than node 0 and is sent node 0's; it
            #    dies while the bytes arrive, then (started again) once they all arrived, before
            #    its slot's meta is written
            for phase in ("snapshot-piece", "snapshot-received"):
                with node1(f"node1-{phase}.log", **{ENV_TEST_KILL_AT: phase}) as one:
                    assert one.wait(300) != 0, one.tail()
                assert "received it from rank 0" not in one.output()
            # 3. its memory gone (a pod recreated on another node): it gets it from node 0
            shutil.rmtree(memory[1], ignore_errors=True)
            with node1("node1-c.log") as one:
                codes = (zero.wait(400), one.wait(60))
                assert codes == (0, 0), f"{codes}\n{zero.tail()}\n{one.tail()}"
            log0, log1 = zero.output(), one.output()
    resumes = RESUMED.findall(log0)  # a resume that died while sending was not logged
    assert resumes, log0[-4000:]
    assert all(rank == "0" and pod == HOSTS[0] for pod, rank, _ in resumes), resumes
    assert "this pod's memory had no snapshot of step" in log1 and "received it from rank 0" in log1
    assert "stays up and rejoins" in log0
    epoch_steps = ck.STEPS_2_RANKS // ck.EPOCHS
    assert all(int(step) < epoch_steps for _, _, step in resumes), "before any durable save"
    final = ck.newest_state(ckpt_dir / "node-0")
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)


TUTORIAL = procs.REPO / "examples" / "tutorial_snapshot_peers.py"


@pytest.mark.timeout(300)
def test_the_tutorial_script_adapted_resumes_mid_epoch_from_memory(work: Path) -> None:
    """examples/tutorial_snapshot_peers.py (the tutorial's torchrun script, a few lines added):
    its writer is killed after its third snapshot (step 9 of 24, in epoch 1); run again, it
    resumes there and ends with the weights of a run never killed."""

    argv = procs.kubeddp_argv(
        "train", "--nproc", "2", "--set", "checkpoint.memory_every_steps=3",
        "--set", "metrics.enabled=false", "--script", str(TUTORIAL), "--", "3", "1",
    )  # fmt: skip

    for run in ("tutorial-whole", "tutorial"):  # each run's snapshot.pt in a folder of its own
        (work / run).mkdir()
    whole = procs.run(argv, work / "tutorial-whole.log", 120, cwd=work / "tutorial-whole")
    assert whole.code == 0, whole.output[-3000:]
    killed_env = procs.child_env({ENV_TEST_KILL_AT: "snapshot-published:3"})
    killed = procs.run(argv, work / "tutorial-1.log", 120, killed_env, work / "tutorial")
    assert killed.code != 0 and "final weights" not in killed.output, killed.output[-3000:]
    again = procs.run(argv, work / "tutorial-2.log", 120, cwd=work / "tutorial")
    assert again.code == 0, again.output[-3000:]
    assert "resumed from memory://" in again.output and "(step 9)" in again.output
    final = [line for line in again.output.splitlines() if line.startswith("final weights")]
    assert final == [line for line in whole.output.splitlines() if line.startswith("final")]


@pytest.mark.timeout(240)
def test_durable_checkpoints_come_by_time_too(work: Path) -> None:
    """checkpoint.every_seconds with no step interval: checkpoints in the middle of the epoch,
    every rank saving at the step their vote agreed on (a rank alone would hang the other)."""
    ckpt_dir = work / "by-time"
    argv = ck.scenario_argv(ckpt_dir, "checkpoint.every_steps=0", "checkpoint.every_seconds=1",
                            "train.max_steps=30", "checkpoint.keep=10")  # fmt: skip
    slower = procs.child_env({workloads.DELAY_ENV: "0.01"})  # 30 steps: about 5 s or more
    done = procs.run(argv, work / "by-time.log", timeout=200, env=slower)
    assert done.code == 0, done.output[-3000:]
    steps = ck.steps(ckpt_dir)
    assert steps[-1] == 30 and len([s for s in steps if s < 30]) >= 2, steps
