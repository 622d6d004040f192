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
    progress.step(110, 0, lr=0.1, samples=64, loss=1.0)
    line = capsys.readouterr().out.strip()
    # 10 steps in 10 s, 90 to go: 90 s (counting the 100 resumed steps would say 8 s).
    assert line.startswith("step 110/200 |") and line.endswith("| eta 0:01:30"), line


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rates_count_the_steps_since_the_previous_line_after_the_first(capsys) -> None:
    clock = FakeClock()
    progress = Progress(enabled=True, log_every=10, tokens_per_sample=8, clock=clock)
    progress.begin(0, 30)
    clock.now += 5.0  # the first step compiles
    progress.step(1, 0, lr=0.1, samples=64, loss=None)
    assert progress.first_step_seconds == 5.0
    for step in range(2, 11):
        clock.now += 0.1
        progress.step(step, 0, lr=0.1, samples=64, loss=2.5 if step == 10 else None)
    line = capsys.readouterr().out.strip()
    # Steps 2..10: 9 steps, 576 samples in 0.9 s; the first step's 5 s count in neither.
    assert "| loss 2.5000 |" in line and "| 640 samples/s | 5,120 tok/s |" in line, line
    assert "| 100.0 ms/step |" in line and line.endswith("| eta 0:00:02"), line
    for step in range(11, 21):
        clock.now += 0.2
        progress.step(step, 0, lr=0.1, samples=64, loss=2.0 if step == 20 else None)
    line = capsys.readouterr().out.strip()
    assert "| 320 samples/s |" in line and "| 200.0 ms/step |" in line, line


def test_the_last_step_is_always_logged(capsys) -> None:
    progress = Progress(enabled=True, log_every=10)
    progress.begin(0, 13)
    assert [s for s in range(1, 14) if progress.is_log_step(s)] == [10, 13]
    progress.step(13, 0, lr=0.1, samples=1, loss=0.5)
    assert capsys.readouterr().out.startswith("step 13/13 | epoch 0 | loss 0.5000 |")


def test_done_line_rates_count_this_run(capsys) -> None:
    progress = _resumed_at_step_100_ten_seconds_ago()
    progress.done(110, 0.5, 2.0, None, samples_per_step=64, tokens_per_sample=0)
    line = capsys.readouterr().out.strip()
    assert line.startswith("done: 110 steps in 0:00:10 (10.0s) | final loss 0.5000 (start 2.0000)")
    assert "| 64 samples/s | 1000.0 ms/step" in line, line


def test_only_rank_0_prints(capsys) -> None:
    progress = Progress(enabled=False, log_every=1)
    progress.begin(0, 10)
    progress.step(1, 0, 0.1, 1, 1.0)
    progress.log("hello")
    assert capsys.readouterr().out == ""
