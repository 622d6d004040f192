"""Checkpoints in a local directory (a PVC, a host path): the default backend.

Layout: <dir>/ckpt-<step:08d>/{state.pt, config.yaml, COMPLETE}. A checkpoint is written into
a temporary sibling directory, fsynced, marked COMPLETE (the marker lists each file's size and
block digests: trainer/checkpoint_digest.py), then renamed; readers only trust directories
with the marker, so a kill at any moment leaves either the old or the new one. A step saved
again moves the old one aside first (`.kubeddp-aside-<name>`) and removes it after the rename;
a writer killed between the two renames leaves the aside, which the next writer puts back.
Only global rank 0 writes (one writer per directory, held by lock.py's WriterLock).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import IO

from kubeddp.trainer import constants
from kubeddp.trainer.checkpoint_digest import FileDigest, HashingWriter, marker_text
from kubeddp.trainer.fault_points import reached
from kubeddp.trainer.worker.checkpoint.lock import WriterLock, check_directory
from kubeddp.trainer.worker.checkpoint.storage import (
    CKPT_RE,
    MARKER,
    NOTE_BYTES,
    CheckpointError,
    CheckpointRef,
    WriteBody,
    reason,
)

PROBE = constants.CHECKPOINT_PROBE
ASIDE_PREFIX = constants.CHECKPOINT_ASIDE_PREFIX  # a step's previous save while a new one is put


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, write: WriteBody) -> FileDigest:
    """Write, flush and fsync one file; what it holds, as the marker records it."""
    # O_EXCL|O_NOFOLLOW: a fresh file in our own temporary directory, never a link's target.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        hashed = HashingWriter(f)
        write(hashed)  # type: ignore[arg-type] - a write-only binary stream
        f.flush()
        os.fsync(f.fileno())
    return hashed.hasher.finish()


def _free_space(root: Path) -> str:
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return ""
    return f"{free / 2**20:.1f} MiB free there; "


class LocalStorage:
    """A directory of checkpoints (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.root = Path(directory)
        self.location = str(self.root)
        self.lock = WriterLock(self.root)

    # ---- the writer's claim ----------------------------------------------------------------
    def prepare(self) -> str | None:
        """Create the directory, prove it writable, take the writer lock. A warning (and no
        lock) on a filesystem without locks."""
        root = check_directory(self.root)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            fd = os.open(root / PROBE, flags, 0o644)
            os.close(fd)
            os.unlink(root / PROBE)
        except OSError as exc:
            raise CheckpointError(
                f"checkpoint.dir {self.root} cannot be written ({exc.strerror or exc}); mount a "
                "writable volume there or set checkpoint.dir to a writable directory"
            ) from None
        warning = self.lock.acquire()
        self.recover()
        return warning

    def recover(self) -> None:
        """Put back a step's previous save that a writer killed between its two renames left
        aside (the new one never took the name), or remove it (the new one did)."""
        for aside in self.root.glob(ASIDE_PREFIX + "*"):
            final = self.root / aside.name[len(ASIDE_PREFIX) :]
            if final.exists() or final.is_symlink():
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(aside, final)
        _fsync_dir(self.root)

    def release(self) -> None:
        self.lock.release()

    def top_names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except (FileNotFoundError, NotADirectoryError):  # prepare() says what is wrong
            return []

    # ---- reading ---------------------------------------------------------------------------
    def list(self) -> list[CheckpointRef]:
        """Complete checkpoints, newest first; a path naming one checkpoint
        (.../ckpt-00000040) lists just that one."""
        root = self.root
        if not root.is_dir():
            return []
        own = CKPT_RE.match(root.name)
        if own and (root / MARKER).is_file():
            return [CheckpointRef(root, int(own.group(1)), LocalStorage(root.parent))]
        refs = []
        for child in root.iterdir():
            m = CKPT_RE.match(child.name)
            if m and (child / MARKER).is_file():
                refs.append(CheckpointRef(child, int(m.group(1)), self))
        return sorted(refs, key=lambda r: r.step, reverse=True)

    def open_file(self, ref: CheckpointRef, name: str) -> IO[bytes]:
        path = Path(ref.path) / name
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CheckpointError(f"{path} is not a regular file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")

    # ---- writing ---------------------------------------------------------------------------
    def write(self, step: int, files: dict[str, WriteBody]) -> CheckpointRef:
        root = self.root
        final = root / f"ckpt-{step:08d}"
        tmp = root / f"{constants.CHECKPOINT_TMP_PREFIX}{step:08d}-{os.getpid()}"
        try:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            digests = {name: _write_file(tmp / name, body) for name, body in files.items()}
            reached("save-files-written")
            marker = marker_text(step, digests).encode()
            _write_file(tmp / MARKER, lambda f: f.write(marker))
            _fsync_dir(tmp)
            reached("save-marked")
            self._rename_into_place(tmp, final)
        except Exception as exc:
            # Any failure, not only OSError: torch's zip writer reports a full disk as a
            # RuntimeError. The half-written temporary goes at once (it may be as large as a
            # checkpoint, on a disk that is full).
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"cannot write checkpoint {final}: {reason(exc)} ({_free_space(root)}check free "
                "space and write permission of checkpoint.dir)"
            ) from exc
        return CheckpointRef(final, step, self)

    def _rename_into_place(self, tmp: Path, final: Path) -> None:
        """`tmp` becomes `final`; a previous save of the step (end of epoch == max_steps) is
        moved aside first, so a kill between the renames leaves it for recover()."""
        aside = self.root / f"{ASIDE_PREFIX}{final.name}"
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
            _fsync_dir(self.root)
            reached("save-old-aside")
        os.rename(tmp, final)
        _fsync_dir(self.root)
        reached("save-renamed")
        shutil.rmtree(aside, ignore_errors=True)

    def delete(self, ref: CheckpointRef) -> None:
        shutil.rmtree(ref.path, ignore_errors=True)

    def remove_partial(self) -> None:
        # There is one writer (global rank 0), so any other temporary is dead and may be as
        # large as a checkpoint.
        for stale in self.root.glob(constants.CHECKPOINT_TMP_PREFIX + "*"):
            shutil.rmtree(stale, ignore_errors=True)

    def set_aside(self, ref: CheckpointRef, suffix: str = ".bad") -> Path | None:
        path = Path(ref.path)
        for attempt in range(100):
            target = path.with_name(f"{path.name}{suffix}" + (f"-{attempt}" if attempt else ""))
            if target.exists():
                continue
            try:
                os.rename(path, target)
            except OSError:
                return None
            return target
        return None

    def read_note(self, name: str) -> str | None:
        try:  # O_NOFOLLOW: a link is not a note; O_NONBLOCK: nor a FIFO, refused below
            fd = os.open(
                self.root / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            )
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return os.read(fd, NOTE_BYTES).decode(errors="replace")
        finally:
            os.close(fd)

    def write_note(self, name: str, text: str | bytes) -> None:
        """Written beside and renamed over: a link at `name` is replaced, never followed."""
        tmp = self.root / f"{constants.CHECKPOINT_NOTE_PREFIX}{os.getpid()}"
        tmp.unlink(missing_ok=True)
        data = text if isinstance(text, bytes) else text.encode()
        try:
            _write_file(tmp, lambda f: f.write(data))
            os.rename(tmp, self.root / name)
        finally:
            if tmp.exists():
                tmp.unlink()
