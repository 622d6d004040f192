"""Rank 0's progress lines: rates and the ETA count the steps of this run, not of the job."""

from __future__ import annotations

import time

import pytest

from kubeddp.trainer.worker.progress import Progress

pytestmark = pytest.mark.timeout(30)


def _resumed_at_step_100_ten_seconds_ago() -> Progress:
    progress = Progress(enabled=True, log_every=10)
    progress.begin(step=100, total_steps=200)
    progress.start = time.perf_counter() - 10.0
    return progress


def test_eta_after_a_resume_uses_the_steps_taken_in_this_run(capsys) -> None:
    progress = _resumed_at_step_100_ten_seconds_ago()
    progress.step(110, 0, loss=1.0, lr=0.1, samples_per_s=1.0, tokens_per_s=0.0, step_ms=1.0)
    line = capsys.readouterr().out.strip()
    # 10 steps in 10 s, 90 to go: 90 s (counting the 100 resumed steps would say 8 s).
    assert line.startswith("step 110/200 |") and line.endswith("| eta 0:01:30"), line


def test_done_line_rates_count_this_run(capsys) -> None:
    progress = _resumed_at_step_100_ten_seconds_ago()
    progress.done(110, 0.5, 2.0, None, samples_per_step=64, tokens_per_sample=0)
    line = capsys.readouterr().out.strip()
    assert line.startswith("done: 110 steps in 0:00:10 (10.0s) | final loss 0.5000 (start 2.0000)")
    assert "| 64 samples/s | 1000.0 ms/step" in line, line


def test_only_rank_0_prints(capsys) -> None:
    progress = Progress(enabled=False, log_every=1)
    progress.begin(0, 10)
    progress.step(1, 0, 1.0, 0.1, 1.0, 0.0, 1.0)
    progress.log("hello")
    assert capsys.readouterr().out == ""
