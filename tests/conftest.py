"""What every test session shares: the in-memory snapshot directories its runs leave behind.

A laptop run keeps its newest snapshot in /dev/shm until it ends, so that a restart resumes
from it; a run a test SIGKILLs never ends, and its directory would stay in the machine's
memory after the session. The session's controller (not an xdist worker, whose end is not the
session's) removes the directories that appeared while it ran.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

SHM = Path("/dev/shm")
PATTERN = f"kubeddp-snapshots-{os.getuid()}-*"
_before: set[Path] = set()


def _is_controller(session: pytest.Session) -> bool:
    return not hasattr(session.config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _is_controller(session):
        _before.update(SHM.glob(PATTERN))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _is_controller(session):
        for leftover in set(SHM.glob(PATTERN)) - _before:
            shutil.rmtree(leftover, ignore_errors=True)
