"""Which command this process runs: `kubeddp launch` (the image's entrypoint) or `kubeddp train`
(the same launch, started from a laptop). Launch's one-line errors carry the name the user
typed, as every command's errors do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

LAUNCH = "kubeddp launch"
TRAIN = "kubeddp train"
_running = [LAUNCH]


def current() -> str:
    return _running[-1]


def error(message: object) -> str:
    """`kubeddp train: error: ...` (or launch's)."""
    return f"{current()}: error: {message}"


def note(message: object) -> str:
    """`kubeddp train: note: ...`: said once, launch goes on."""
    return f"{current()}: note: {message}"


@contextmanager
def running(name: str) -> Iterator[None]:
    """Errors say `name` while the block runs (launch may run in a test's process)."""
    _running.append(name)
    try:
        yield
    finally:
        _running.pop()
