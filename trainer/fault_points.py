"""Named points where a test may SIGKILL this process, to prove a crash there loses nothing.

The crash tests of checkpoints (tests/integration/test_keeper_crash_points.py) kill the writer,
a pod's sync or the keeper at every step of a save, a send and a commit, then check that the old
or the new checkpoint survives, whole. `KUBEDDP_TEST_KILL_AT=NAME` kills at the first time this
process reaches NAME, `NAME:N` at the Nth. Unset (always, outside tests) it costs one lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

from kubeddp.trainer.constants import ENV_TEST_KILL_AT

_reached: Counter[str] = Counter()


def reached(name: str) -> None:
    wanted = os.environ.get(ENV_TEST_KILL_AT)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _reached[name] += 1
    if _reached[name] == (int(nth) if nth.isdigit() else 1):
        os.kill(os.getpid(), signal.SIGKILL)
