"""Checkpoint saves that fail under a real run: a full disk and a read-only directory (private
tmpfs mounts). checkpoint.on_save_error decides: `stop` ends the job cleanly with a non-zero
code, `continue` trains on, but a failed final save fails the run; either way the error names
the path and the previous checkpoint stays intact. A read-only directory is refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.worker import checkpoint as ckpt
from tests.helpers import checkpoints as ck
from tests.helpers import mounts, procs, workloads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_full_disk_with_on_save_error_stop_ends_cleanly(tmp_path: Path) -> None:
    with mounts.tmpfs(tmp_path / "disk", size="2m") as disk:
        ckpt_dir = disk / "ckpts"
        argv = ck.scenario_argv(
            ckpt_dir, "checkpoint.on_save_error=stop", "train.record_sample_ids=false"
        )
        slow = procs.child_env({workloads.DELAY_ENV: "0.01"})  # ~0.8 s between two saves
        with procs.started(argv, tmp_path / "full.log", slow) as run:
            first = ckpt_dir / f"ckpt-{ck.SAVE_EVERY:08d}" / ckpt.MARKER
            procs.wait_until(first.exists, 120, "the first checkpoint", run)
            mounts.fill(disk)
            code = run.wait(120)
        log = run.output()
        assert code == 1, run.tail()
        failed = f"cannot write checkpoint {ckpt_dir / f'ckpt-{2 * ck.SAVE_EVERY:08d}'}"
        assert failed in log and "No space left on device" in log, run.tail()
        assert "checkpoint.on_save_error=stop" in log
        assert "Traceback" not in log, "a full disk is an expected error, not a crash"
        assert ck.steps(ckpt_dir) == [ck.SAVE_EVERY], "the previous checkpoint must remain"
        assert ck.newest_state(ckpt_dir)["step"] == ck.SAVE_EVERY
        assert not [p for p in ckpt_dir.iterdir() if p.name.startswith(".tmp")]


def test_read_only_directory_is_refused_before_training(tmp_path: Path) -> None:
    # Issue 21: with on_save_error=continue a read-only volume used to train for days with no
    # checkpoint; it is an error at start now (one line, exit 2), whatever the policy.
    with mounts.tmpfs(tmp_path / "ro") as ro:
        (ro / "ckpts").mkdir()
        mounts.remount_readonly(ro)
        argv = procs.kubeddp_argv(
            "train", "--nproc", "1",
            "--set", "workload.name=regression",
            "--set", "train.max_steps=12",
            "--set", f"checkpoint.dir={ro / 'ckpts'}",
            "--set", "checkpoint.every_steps=5",
            "--set", "checkpoint.on_save_error=continue",
            "--set", "metrics.enabled=false",
        )  # fmt: skip
        done = procs.run(argv, tmp_path / "ro.log", timeout=120)
    assert done.code == exit_codes.BAD_INPUT, done.output[-4000:]
    line = f"kubeddp: error (rank 0): checkpoint.dir {ro / 'ckpts'} cannot be written (Read-only"
    assert line in done.output, done.output[-4000:]
    assert "step 1/" not in done.output and "Traceback" not in done.output


def test_full_disk_with_on_save_error_continue_trains_on_but_a_lost_final_save_fails(
    tmp_path: Path,
) -> None:
    # A model whose state (~1.2 MB with Adam's moments) fits a 2 MB disk once: the second save
    # fails inside torch's zip writer, which raises RuntimeError, not OSError.
    with mounts.tmpfs(tmp_path / "disk", size="2m") as disk:
        ckpt_dir = disk / "ckpts"
        argv = procs.kubeddp_argv(
            "train", "--nproc", "1",
            "--set", "workload.name=regression",
            "--set", "workload.input_dim=100",
            "--set", "workload.hidden_dim=1000",
            "--set", "train.max_steps=30",
            "--set", "checkpoint.every_steps=10",
            "--set", f"checkpoint.dir={ckpt_dir}",
            "--set", "checkpoint.on_save_error=continue",
            "--set", "metrics.enabled=false",
        )  # fmt: skip
        done = procs.run(argv, tmp_path / "full.log", timeout=120)
        left = sorted(p.name for p in ckpt_dir.iterdir())
        steps = ck.steps(ckpt_dir)
        first_step = ck.newest_state(ckpt_dir)["step"]
    # Issue 24: the final save (step 30) failed too, so the run's result is not on disk: not a
    # success, whatever on_save_error says.
    assert done.code == exit_codes.TRAINING_FAILED, done.output[-4000:]
    assert "the final checkpoint could not be saved" in done.output
    assert "[kubeddp] finished" not in done.output
    assert "Traceback" not in done.output, "a full disk is a save error, not a crash"
    for step in (20, 30):
        assert f"cannot write checkpoint {ckpt_dir / f'ckpt-{step:08d}'}" in done.output
    assert "done: 30 steps" in done.output
    assert steps == [10] and first_step == 10, "the checkpoint saved before stays intact"
    assert not [name for name in left if name.startswith(".tmp")], f"temporaries left: {left}"
