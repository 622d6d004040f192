"""A peer that stops participating (SIGSTOP: a hung process, a frozen node) fails the other
ranks within ddp.timeout_seconds, and the pod ends with the retryable PEER_FAILED.

The training timeout replaces the longer start-up timeout after the first step, and the log
says so: a test that sees the switch line knows which timeout is in force.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from tests.helpers import checkpoints as ck
from tests.helpers import procs, workloads

# alone: the healthy ranks must finish each collective within the 4 s training timeout
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(180)]

TIMEOUT_SECONDS = 4


def test_a_hung_peer_ends_the_job_within_the_training_timeout(tmp_path: Path) -> None:
    argv = ck.scenario_argv(
        tmp_path / "ckpt",
        f"ddp.timeout_seconds={TIMEOUT_SECONDS}",
        "checkpoint.preempt_grace_seconds=1",
    )
    slow = procs.child_env({workloads.DELAY_ENV: "0.002"})
    with procs.started(argv, tmp_path / "hung.log", slow) as run:
        switched = rf"collective timeout now ddp\.timeout_seconds={TIMEOUT_SECONDS} s "
        run.wait_for_output(switched + r"\(start-up: 1800 s\)", 120)
        run.wait_for_output(r"step\s+10/", 60)
        workers = procs.torchrun_workers(run.pid)
        assert sorted(workers) == [0, 1], workers
        os.kill(workers[1], signal.SIGSTOP)
        try:
            failed = run.wait_for_output(r"kubeddp: error \(rank 0\): (.*)", 60)
        finally:
            # The agent has sent the hung rank SIGTERM, pending while it is stopped (torch would
            # SIGKILL it 30 s later): let it go, it exits within its 1 s grace.
            if procs.cmdline(workers[1]):
                os.kill(workers[1], signal.SIGCONT)
        code = run.wait(60)
    # gloo names the timeout that ended the wait (the training one: the start-up one is 1800 s
    # and the job ended within the 60 s waited above), or, when the timeout closed the pair
    # under another operation first, says so
    said = failed.group(1)
    assert f"{TIMEOUT_SECONDS * 1000}ms" in said or "timeout caused pair closure" in said, said
    assert f"exit code {exit_codes.describe(exit_codes.PEER_FAILED)}" in failed.group(1)
    assert code == exit_codes.PEER_FAILED, run.tail()
    assert "Traceback" not in run.output(), "a peer's failure is one line, not a traceback"
