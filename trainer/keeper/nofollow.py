"""Walking down a checkpoint directory one part at a time without following a link: the
keeper's store and a pod's local copy both write only where a real directory stands."""

from __future__ import annotations

import contextlib
import os

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def descend(fd: int, parts: list[str], create: bool = False) -> int:
    """From directory descriptor `fd` (taken over: closed unless handed back) down `parts`, each
    made where missing when `create`; the last directory's descriptor. OSError (with `fd`
    closed) where a part is missing, a link or a file."""
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            inner = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd
