"""SIGTERM at 20 moments of a short `kubeddp train --script` run, from the first imports to
the metrics endpoint's last half second: every exit is 0 (the program had finished) or 143,
never 4 (an internal error: torchrun's SignalException escaping while the endpoint shut down).

One tiny program (no torch in it) is run again and again; each moment is an offset after a
line the run prints, so the moments fall in the same phases however fast the machine is. A
death by the signal itself (before launch's handler exists) is what a container reports as
143 too.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from kubeddp.trainer import constants, exit_codes
from tests.helpers import procs

# alone: each moment is an offset of tenths of a second after a line the run prints
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(900)]
PROGRAM = """import sys, time
print("tiny started", flush=True)
time.sleep(0.4)
print("tiny finishing", flush=True)
"""
LINGER = 0.3  # seconds /metrics stays up after training: a line to anchor the last moments
# (a line the run prints, or None for the start; seconds after it)
MOMENTS = [
    (None, 0.0), (None, 0.3), (None, 1.0),
    (r"rendezvous:", 0.0), (r"\[kubeddp\] metrics: http", 0.0),
    (r"tiny started", 0.0), (r"tiny started", 0.25),
    (r"tiny finishing", 0.0), (r"tiny finishing", 0.05), (r"tiny finishing", 0.1),
    (r"tiny finishing", 0.2),
    (r"serving \S+ more", 0.0), (r"serving \S+ more", 0.1), (r"serving \S+ more", 0.2),
    (r"serving \S+ more", 0.3), (r"serving \S+ more", 0.35), (r"serving \S+ more", 0.4),
    (r"serving \S+ more", 0.5), (r"serving \S+ more", 0.6), (r"serving \S+ more", 0.8),
]  # fmt: skip
ANCHOR_SECONDS = 120  # a generous bound for a line to appear (the run ending first is fine)


def signal_at(run: procs.Proc, anchor: str | None, delay: float) -> None:
    if anchor is not None:
        end = time.monotonic() + ANCHOR_SECONDS
        regex = re.compile(anchor)
        while not regex.search(run.output()) and run.poll() is None:
            assert time.monotonic() < end, f"no {anchor!r}\n{run.tail()}"
            time.sleep(0.01)
    time.sleep(delay)
    if run.poll() is None:
        run.send_signal(signal.SIGTERM)


def test_sigterm_at_twenty_moments_ends_0_or_143(tmp_path: Path) -> None:
    assert len(MOMENTS) == 20
    program = tmp_path / "tiny.py"
    program.write_text(PROGRAM)
    argv = procs.kubeddp_argv(
        "train", "--nproc", "1", "--set", "metrics.port=0", "--script", str(program)
    )
    env = procs.child_env({constants.ENV_METRICS_LINGER: str(LINGER)})
    seen = []
    for index, (anchor, delay) in enumerate(MOMENTS):
        with procs.started(argv, tmp_path / f"run{index}.log", env) as run:
            signal_at(run, anchor, delay)
            code = run.wait(120)
            code = 128 - code if code < 0 else code  # death by the signal: 143 in a pod
            seen.append((anchor, delay, code))
            assert code in (exit_codes.OK, exit_codes.PREEMPTED), (anchor, delay, run.tail())
            assert "internal error" not in run.output(), run.tail()
    print(seen)
