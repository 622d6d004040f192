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

_NAME = re.compile(r"(?P<host>.+)-(?P<pid>[0-9]+)-(?P<start>[0-9]+)-[^-]+")


def root() -> Path:
    """The scratch directory: /tmp in the image (a volume), the system's temp dir elsewhere."""
    scratch = constants.SCRATCH_DIR
    return Path(scratch if os.path.isdir(scratch) else tempfile.gettempdir())


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the name before ')' may hold spaces
    try:
        return int(fields[19])  # field 22 of proc(5); fields[0] is field 3
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
    """A fresh directory named for this process, after sweeping dead owners' ones."""
    sweep(prefix)
    start = _start_time(os.getpid()) or 0
    owner = f"{prefix}{_host()}-{os.getpid()}-{start}-"
    return Path(tempfile.mkdtemp(prefix=owner, dir=root()))
