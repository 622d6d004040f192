"""Directories a launch makes in the scratch directory (/tmp), and what a killed launch left.

Each is named <prefix><host>-<pid>-<start>-<random>, start being the owner's start time: a
launch removes its own when it ends, and a later launch on the same host removes those whose
owner is gone (kill -9, OOM, a container restart with a fresh pid namespace): a pid that is
alive but started at another time is not the owner.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from kubeddp.trainer import constants
from kubeddp.trainer.common import proc_stat

_NAME = re.compile(r"(?P<host>.+)-(?P<pid>[0-9]+)-(?P<start>[0-9]+)-[^-]+")
# A launch's own files there (the ranks' records, metrics files, torchrun's logs) take far less;
# a full /tmp (0 bytes) is what this catches before a worker meets it (SIGBUS, a traceback).
MIN_FREE_BYTES = 1 << 20
WHAT_GOES_THERE = "the workers' progress records, metrics files and torchrun's logs go there"


class ScratchError(OSError):
    """The scratch directory cannot hold a launch's files; one line with the fix."""


def problem() -> str | None:
    """Why the scratch directory cannot take a launch's files (read-only, not writable, full),
    or None. Read-only or full, a retry on the same mount would fail the same way."""
    where = root()
    fix = (
        f"{WHAT_GOES_THERE}: mount a writable {where} with free space (kubeddp's manifests "
        "mount an emptyDir there) or free some space in it"
    )
    try:
        stats = os.statvfs(where)
    except OSError as exc:
        return f"the scratch directory {where} cannot be read ({exc.strerror}); {fix}"
    if stats.f_flag & os.ST_RDONLY:
        return f"the scratch directory {where} is on a read-only filesystem; {fix}"
    if not os.access(where, os.W_OK | os.X_OK):
        return f"the scratch directory {where} is not writable by uid {os.getuid()}; {fix}"
    free = stats.f_bavail * stats.f_frsize
    if free < MIN_FREE_BYTES or (stats.f_files and not stats.f_favail):
        room = f"{free} bytes, {stats.f_favail} files free"
        return f"the scratch directory {where} is full ({room}); {fix}"
    return None


def root() -> Path:
    """The scratch directory: /tmp in the image (a volume), the system's temp dir elsewhere."""
    scratch = constants.SCRATCH_DIR
    return Path(scratch if os.path.isdir(scratch) else tempfile.gettempdir())


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None where unknown."""
    fields = proc_stat(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of proc(5); fields[0] is field 3
    except (IndexError, ValueError):
        return None


def _alive(pid: int, start: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        pass
    started = _start_time(pid)
    return started is None or started == start or start == 0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def sweep(prefix: str) -> list[Path]:
    """Remove `prefix` directories of this host whose owner is dead; return them."""
    removed = []
    try:
        entries = list(root().iterdir())
    except OSError:
        return removed
    host = _host()
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        found = _NAME.fullmatch(entry.name[len(prefix) :])
        if not found or found.group("host") != host:
            continue
        if _alive(int(found.group("pid")), int(found.group("start"))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def owned_dir(prefix: str) -> Path:
    """A fresh directory named for this process, after sweeping dead owners' ones; ScratchError
    when it cannot be made (the scratch directory filled or turned read-only since the check)."""
    sweep(prefix)
    start = _start_time(os.getpid()) or 0
    owner = f"{prefix}{_host()}-{os.getpid()}-{start}-"
    try:
        return Path(tempfile.mkdtemp(prefix=owner, dir=root()))
    except OSError as exc:
        raise ScratchError(
            f"cannot make a directory in the scratch directory {root()} ({exc.strerror}); "
            f"{WHAT_GOES_THERE}: mount a writable one with free space"
        ) from None
