"""One writer per checkpoint directory: a lock file that global rank 0 holds while it trains.

Two runs writing ckpt-* into one directory (a restarted job beside orphaned workers of the old
one, two jobs given the same PVC path) would prune and replace each other's checkpoints. The
lock is a POSIX record lock (`lockf`) on <dir>/.kubeddp-writer.lock: the kernel releases it
when its holder dies, even by SIGKILL, so a crashed run never blocks the next one; unlike
`flock`, the processes rank 0 forks (DataLoader workers, compile workers) do not inherit it, so
none of them keeps it past rank 0's death; and it works on NFS. A POSIX lock belongs to the
process, so one process is also kept from locking a directory twice by a table of its own. The
file names its holder (pid, host) for the error message. It is opened with O_NOFOLLOW: a link
planted at its path is refused, never followed (its target would be truncated).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from pathlib import Path

from kubeddp.trainer import constants
from kubeddp.trainer.worker.checkpoint.storage import CheckpointError

LOCK_FILE = constants.CHECKPOINT_LOCK_FILE
# A directory the lock cannot be made in cannot hold checkpoints either: refused at start, so
# a job never trains for days without a checkpoint (checkpoint.on_save_error is for later).
_CANNOT_WRITE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


class DirectoryInUse(CheckpointError):
    """Another live process holds the directory's lock."""


_held_here: set[str] = set()  # lock files this process holds (POSIX locks are per process)


def check_directory(directory: str | Path) -> Path:
    """checkpoint.dir as a directory (created with its parents); CheckpointError when it or a
    parent is a file."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise CheckpointError(
            f"checkpoint.dir {root} is a file, not a directory; set checkpoint.dir to a "
            "directory (it is created when missing)"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CheckpointError(
            f"checkpoint.dir {root} cannot be a directory: a part of its path is a file; set "
            "checkpoint.dir to another path"
        ) from None
    return root


class WriterLock:
    """The lock of one checkpoint directory, held from `acquire` until `release` or exit."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> str | None:
        """Take the lock, or raise DirectoryInUse naming the holder; CheckpointError when the
        directory cannot be written or the lock path is a link. Returns a warning (and holds
        nothing) on a filesystem without locks."""
        if os.path.realpath(self.path) in _held_here:
            raise DirectoryInUse(
                f"checkpoint.dir {self.directory} is in use by another run (pid {os.getpid()} on "
                f"{socket.gethostname()}: this process); give this one another checkpoint.dir"
            )
        try:
            root = check_directory(self.directory)
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(root / LOCK_FILE, flags, 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted there
                os.close(fd)
                raise OSError(errno.ELOOP, "not a regular file")
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CheckpointError(
                    f"checkpoint.dir {self.directory}: {LOCK_FILE} is a link or not a regular "
                    "file; kubeddp never writes through it: remove it, or use another "
                    "checkpoint.dir"
                ) from None
            if exc.errno in _CANNOT_WRITE:
                raise CheckpointError(
                    f"checkpoint.dir {self.directory} is not writable ({exc.strerror}); mount a "
                    "writable volume there or set checkpoint.dir to a writable directory"
                ) from None
            raise CheckpointError(
                f"checkpoint.dir {self.directory}: cannot create {LOCK_FILE} "
                f"({exc.strerror or exc}); check the path"
            ) from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another process holds it
            holder = _read_holder(fd)
            os.close(fd)
            raise DirectoryInUse(
                f"checkpoint.dir {self.directory} is in use by another run ({holder}); stop "
                "that run first, or give this one another checkpoint.dir"
            ) from None
        except OSError as exc:  # ENOLCK: a filesystem without locks (some NFS setups)
            os.close(fd)
            return (
                f"[kubeddp] warning: checkpoint.dir {self.directory} cannot be locked "
                f"({exc.strerror}); make sure no other run writes there"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        _held_here.add(os.path.realpath(self.path))
        return None

    def release(self) -> None:
        if self._fd is not None:
            _held_here.discard(os.path.realpath(self.path))
            os.close(self._fd)  # closing it drops the lock
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
