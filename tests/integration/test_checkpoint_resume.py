"""Exact resume with real processes: a worker killed with SIGKILL mid-epoch, torchrun's restart,
a corrupt newest checkpoint, and a checkpoint of another model.

Every interrupted run is compared with one uninterrupted run of the same seed: the final
parameters must be bitwise equal (CPU, gloo, two ranks: the sum of two gradients does not
depend on the order), and each training sample of each epoch trained exactly once.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from tests.helpers import checkpoints as ck
from tests.helpers import procs, workloads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# 2 ms per sample = ~32 ms per step: the run lasts long enough to act on it mid-epoch.
SLOW = procs.child_env({workloads.DELAY_ENV: "0.002"})


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resume")


def test_killed_worker_restarts_and_every_sample_is_trained_once(work: Path) -> None:
    baseline = ck.baseline_state(work)
    ckpt_dir = work / "killed"
    # Killed in epoch 1 after the checkpoint of step 45: steps after 45 are redone.
    mid_epoch = ckpt_dir / f"ckpt-{45:08d}" / "COMPLETE"
    # snapshots every 3 steps (auto picks from the machine's load): one lies after step 45
    argv = ck.scenario_argv(ckpt_dir, "checkpoint.memory_every_steps=3", max_restarts=1)
    with procs.started(argv, work / "killed.log", SLOW) as run:
        procs.wait_until(mid_epoch.exists, 120, "the checkpoint of step 45", run)
        workers = procs.wait_until(lambda: procs.torchrun_workers(run.pid), 10, "workers", run)
        os.kill(workers[0], signal.SIGKILL)  # rank 0: the checkpoint writer
        code = run.wait(150)
    log = run.output()
    assert code == 0, run.tail()
    assert "exitcode: -9" in log, "torchrun did not see the killed worker"
    # torchrun restarts the workers on the same host: the state is still in its memory, newer
    # than the checkpoint of step 45
    resumed = re.search(r"resumed from memory://\S+ \(step (\d+)", log)
    assert resumed and int(resumed.group(1)) >= 45, run.tail()
    final = ck.newest_state(ckpt_dir)
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)


def test_truncated_newest_checkpoint_is_reported_and_the_previous_one_used(work: Path) -> None:
    baseline = ck.baseline_state(work)
    ckpt_dir = work / "truncated"
    shutil.copytree(ck.baseline_dir(work), ckpt_dir)
    steps = ck.steps(ckpt_dir)
    newest, previous = ckpt_dir / f"ckpt-{steps[-1]:08d}", ckpt_dir / f"ckpt-{steps[-2]:08d}"
    state_file = newest / "state.pt"
    state_file.write_bytes(state_file.read_bytes()[:1000])  # COMPLETE marker still there

    done = procs.run(ck.scenario_argv(ckpt_dir), work / "truncated.log", timeout=150)
    assert done.code == 0, done.output[-4000:]
    assert f"checkpoint {newest} is unreadable" in done.output
    assert f"resumed from {previous}" in done.output
    # The steps after the previous checkpoint were trained again, to the same result.
    final = ck.newest_state(ckpt_dir)
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)


def test_checkpoint_of_another_model_is_refused_in_one_line(work: Path) -> None:
    ckpt_dir = work / "other-model"
    shutil.copytree(ck.baseline_dir(work), ckpt_dir)
    before = ck.steps(ckpt_dir)
    argv = ck.scenario_argv(ckpt_dir, "workload.hidden_dim=32", nproc=1)
    done = procs.run(argv, work / "other-model.log", timeout=120)
    assert done.code == 2, done.output[-4000:]  # a config problem, not a crash: no retry
    lines = [line for line in done.output.splitlines() if "written for another model" in line]
    assert lines, done.output[-4000:]
    assert "checkpoint.weights_only=true" in lines[0] and str(ckpt_dir) in lines[0]
    assert ck.steps(ckpt_dir) == before, "a refused resume must not touch the checkpoints"


def test_weights_only_loads_matching_tensors_and_starts_fresh(work: Path) -> None:
    ckpt_dir = work / "weights-only"
    source = ck.baseline_dir(work)
    baseline = ck.newest_state(source)
    # input_dim 10 instead of 20: the first layer's weight no longer fits, the rest does.
    argv = ck.scenario_argv(
        ckpt_dir,
        "workload.input_dim=10",
        f"checkpoint.resume={source}",
        "checkpoint.weights_only=true",
        "train.max_steps=1",
        "train.lr=0",
        "train.grad_clip=0",
        "train.record_sample_ids=false",
        nproc=1,
    )
    done = procs.run(argv, work / "weights-only.log", timeout=120)
    assert done.code == 0, done.output[-4000:]
    assert "loaded 3/4 weight tensors" in done.output
    final = ck.newest_state(ckpt_dir)
    assert final["step"] == 1, "weights_only must restart the step count"
    # lr=0: one step leaves the loaded weights as they were.
    for name in ("0.bias", "2.weight", "2.bias"):
        assert (final["model"][name] == baseline["model"][name]).all(), name
    assert final["model"]["0.weight"].shape[1] == 10
