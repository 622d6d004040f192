"""A worker that returned 0 while its peers still ran: the program's bug, not a lost peer.

When rank 1 of a user's program returns early, rank 0's next collective fails ("connection
closed by peer") and, by itself, would end the pod with the retryable PEER_FAILED: retried
forever for a deterministic bug. So each worker of a user program notes here that it returned
0 (trainer/worker/program.py), and a failed group whose only cause is a lost peer is reported
as the program's own failure when a local worker had already returned 0 before that failure.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from kubeddp.trainer import constants

_MARK = "rank-"


def note_start() -> None:
    """A (re)started worker: forget what an earlier attempt of this rank noted."""
    path = _mark_path()
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def note_returned() -> None:
    """This worker's program returned 0 (called only in a group of several workers)."""
    path = _mark_path()
    if path is not None:
        with contextlib.suppress(OSError):
            path.write_text(repr(time.time()))


def _mark_path() -> Path | None:
    folder = os.environ.get(constants.ENV_EXITED_DIR)
    rank = os.environ.get("RANK", "")
    if not folder or not rank.isdigit() or int(os.environ.get("WORLD_SIZE", "1") or 1) < 2:
        return None
    return Path(folder) / f"{_MARK}{int(rank)}"


def returned_before(folder: Path, failed_at: float) -> list[int]:
    """The ranks that noted a return of 0 no later than `failed_at` (seconds since the epoch;
    torch's failure timestamps are whole seconds, hence the second of slack)."""
    ranks = []
    for path in sorted(folder.glob(f"{_MARK}*")):
        try:
            when = float(path.read_text())
        except (OSError, ValueError):
            continue
        if when <= failed_at + 1:
            ranks.append(int(path.name[len(_MARK) :]))
    return sorted(ranks)
