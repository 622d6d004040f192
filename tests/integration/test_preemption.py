"""Preemption with real processes: SIGTERM to `kubeddp train` (as tini/the kubelet sends it)
saves a checkpoint and exits 143; the next run resumes it and ends where an uninterrupted run
ends. A save that cannot finish within checkpoint.preempt_grace_seconds still exits 143.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from tests.helpers import checkpoints as ck
from tests.helpers import procs, workloads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SLOW = procs.child_env({workloads.DELAY_ENV: "0.002"})


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("preempt")


def test_sigterm_saves_exits_143_and_the_resumed_run_completes(work: Path) -> None:
    baseline = ck.baseline_state(work)
    ckpt_dir = work / "sigterm"
    argv = ck.scenario_argv(ckpt_dir)
    with procs.started(argv, work / "sigterm.log", SLOW) as run:
        first = ckpt_dir / f"ckpt-{10:08d}" / "COMPLETE"
        procs.wait_until(first.exists, 120, "the checkpoint of step 10", run)
        run.send_signal(signal.SIGTERM)
        code = run.wait(90)
    assert code == exit_codes.PREEMPTED, run.tail()
    saved = run.wait_for_output(r"SIGTERM: saving a checkpoint at step (\d+)", 1)
    stop_step = int(saved.group(1))
    assert 10 <= stop_step < ck.STEPS_2_RANKS
    assert ck.steps(ckpt_dir)[-1] == stop_step, "the preemption checkpoint is the newest"

    resumed = procs.run(argv, work / "sigterm-resume.log", timeout=150)
    assert resumed.code == 0, resumed.output[-4000:]
    # The stop step is in the laptop's memory too (kept: 143 is retried): no storage is read
    assert f"rank-0 (step {stop_step}," in resumed.output, resumed.output[-4000:]
    assert "resumed from memory://" in resumed.output
    final = ck.newest_state(ckpt_dir)
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)


def test_grace_budget_is_enforced_when_the_save_cannot_happen_in_time(work: Path) -> None:
    """One step takes ~2 s here and the grace is 0.5 s: the worker cannot reach the save point.

    SIGTERM goes to the worker itself (as `docker stop` with `tini -g` would); the worker must
    exit 143 on its own and launch must pass that code on.
    """
    ckpt_dir = work / "grace"
    slow_steps = procs.child_env({workloads.DELAY_ENV: "0.25"})
    argv = ck.scenario_argv(
        ckpt_dir,
        "train.batch_size=8",
        "train.log_every=1",
        "checkpoint.every_steps=1",
        "checkpoint.preempt_grace_seconds=0.5",
        nproc=1,
    )
    with procs.started(argv, work / "grace.log", slow_steps) as run:
        first = ckpt_dir / f"ckpt-{1:08d}" / "COMPLETE"
        procs.wait_until(first.exists, 120, "the checkpoint of step 1", run)
        workers = procs.wait_until(lambda: procs.torchrun_workers(run.pid), 10, "worker", run)
        os.kill(workers[0], signal.SIGTERM)  # early in step 2, which takes ~2 s
        code = run.wait(60)
    log = run.output()
    assert "no checkpoint within checkpoint.preempt_grace_seconds=0.5" in log, run.tail()
    assert f"exitcode: {exit_codes.PREEMPTED}" in log, run.tail()
    assert code == exit_codes.PREEMPTED, run.tail()
    assert "SIGTERM: saving" not in log
    assert ck.newest_state(ckpt_dir)["step"] == 1, "the previous checkpoint is kept"
