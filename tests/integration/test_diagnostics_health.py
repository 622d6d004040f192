"""Stragglers and non-finite losses, in real two-rank gloo runs.

- a rank whose steps take twice the others' work is named a straggler within the window; a
  healthy run names none;
- a NaN injected at step k on one rank is named with the step and the rank, and each
  diagnostics.on_nonfinite action does what it says (built-in trainer and user script).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.worker import checkpoint as ckpt
from tests.helpers import faults, procs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SCRIPT = procs.REPO / "tests" / "helpers" / "fault_script.py"
NAN_STEP = 7


def _train(tmp: Path, fault: str, rank: int, step: int, *sets: str, **args: object):
    argv = procs.kubeddp_argv("train", "--nproc", "2")
    argv += faults.settings(fault, rank, step, samples=2048, batch_size=16, **args)
    for item in (
        "train.batch_size=16",
        "train.log_every=5",
        f"checkpoint.dir={tmp / 'ckpt'}",
        "metrics.port=0",
        *sets,
    ):
        argv += ["--set", item]
    return procs.run(argv, tmp / "run.log", 300)


@pytest.mark.alone  # a rank slowed by another test could look twice as slow for the window
@pytest.mark.parametrize(("rank", "named"), [(1, True), (-1, False)])
def test_a_rank_twice_as_slow_is_named_a_straggler_and_none_in_a_healthy_run(
    tmp_path: Path, rank: int, named: bool
) -> None:
    done = _train(
        tmp_path, "slow", rank, 0, "diagnostics.straggler_window_seconds=3", "train.max_steps=60",
        work_ms=40,
    )  # fmt: skip
    assert done.code == 0, done.output[-3000:]
    verdicts = re.findall(
        r"\[kubeddp\] straggler: rank (\d+) \((pod [^)]*)\) works ([\d.]+)x", done.output
    )
    if named:
        assert verdicts, done.output[-3000:]
        assert {int(r) for r, _, _ in verdicts} == {1}, verdicts
        assert all(float(x) >= 1.5 for _, _, x in verdicts), verdicts
    else:
        assert not verdicts, verdicts


def test_a_nan_stops_the_run_naming_step_and_rank(tmp_path: Path) -> None:
    done = _train(tmp_path, "nan", 1, NAN_STEP)
    assert done.code == exit_codes.NONFINITE, done.output[-3000:]
    assert f"non-finite loss at step {NAN_STEP} on rank 1" in done.output, done.output[-3000:]
    assert "Traceback" not in done.output


def test_keep_last_good_sets_aside_the_checkpoints_after_the_nan(tmp_path: Path) -> None:
    done = _train(
        tmp_path, "nan", 0, NAN_STEP, "diagnostics.on_nonfinite=keep_last_good",
        "checkpoint.every_steps=2", "checkpoint.keep=10",
    )  # fmt: skip
    assert done.code == exit_codes.NONFINITE, done.output[-3000:]
    assert f"non-finite loss at step {NAN_STEP} on rank 0" in done.output
    kept = sorted(ref.step for ref in ckpt.list_checkpoints(tmp_path / "ckpt"))
    assert kept and max(kept) < NAN_STEP, kept
    assert (tmp_path / "ckpt" / "ckpt-00000008.bad").is_dir(), sorted(
        p.name for p in (tmp_path / "ckpt").iterdir()
    )
    state = ckpt.load_state(ckpt.list_checkpoints(tmp_path / "ckpt")[0])
    assert all(t.isfinite().all() for t in state["model"].values())


def test_skip_leaves_out_the_nan_step_and_training_goes_on(tmp_path: Path) -> None:
    done = _train(tmp_path, "nan", 1, NAN_STEP, "diagnostics.on_nonfinite=skip")
    assert done.code == 0, done.output[-3000:]
    assert f"non-finite loss at step {NAN_STEP} on rank 1: the step was skipped" in done.output
    state = ckpt.load_state(ckpt.list_checkpoints(tmp_path / "ckpt")[0])
    assert all(t.isfinite().all() for t in state["model"].values())
    # the log line of the interval that held the NaN shows it; every later one is finite
    losses = re.findall(r"loss ([\d.]+|nan)", done.output.split("skipped", 1)[1])[1:]
    assert losses and all(v != "nan" and math.isfinite(float(v)) for v in losses), losses


@pytest.mark.parametrize(("action", "code"), [("stop", exit_codes.NONFINITE), ("skip", 0)])
def test_a_user_script_nan_is_named_through_report_step(
    tmp_path: Path, action: str, code: int
) -> None:
    argv = procs.kubeddp_argv("train", "--nproc", "2")
    argv += ["--set", "metrics.port=0", "--set", f"diagnostics.on_nonfinite={action}"]
    argv += ["--script", str(SCRIPT), "--", "--fault", "nan", "--rank", "1", "--step", "6"]
    argv += ["--report", "--steps", "12"]
    done = procs.run(argv, tmp_path / "run.log", 300)
    assert done.code == code, done.output[-3000:]
    assert re.search(r"non-finite loss \(nan\) at step 6 on rank 1", done.output), done.output[
        -3000:
    ]
