"""Uploads to the checkpoint keeper: staged block by block, each block checked on arrival
against the digest the writer recorded, committed whole by one rename or not at all.

An upload (keeper_protocol.Upload) is begun with its files' sizes and digests; the keeper
refuses it at once (507) when the disk cannot hold it. Every block that arrives is hashed and
written in place; a block whose bytes differ from its digest is refused (422) and must come
again. A commit needs every block, and a checkpoint directory also needs its COMPLETE marker to
list exactly the digests that arrived. Then the files are flushed to the disk, the keeper's
record is written beside them, and the directory (or file) takes its name by one rename; a
previous copy of the name is moved aside first and put back at start if the keeper was killed
between the two renames (keeper/store.py). A keeper restarted mid-upload forgets it: the
client's next request gets 404 and it begins again; nothing half sent is ever committed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from kubeddp.trainer.checkpoint_digest import DigestError, read_marker
from kubeddp.trainer.fault_points import reached
from kubeddp.trainer.keeper.blocks import receive_block
from kubeddp.trainer.keeper.protocol import MARKER, Upload
from kubeddp.trainer.keeper.store import (
    Store,
    StoreError,
    fsync_dir,
    storage_error,
    write_record,
)

MAX_UPLOADS = 64
IDLE_SECONDS = 600.0  # an upload untouched this long was left by a lost pod: removed
FREE_MARGIN = 1 << 20


@dataclass
class Staged:
    """One upload being received."""

    id: str
    upload: Upload
    folder: str  # .kubeddp-keeper/incoming/ID
    fds: list[int]
    received: list[set[int]]
    receiving: set[tuple[int, int]] = field(default_factory=set)
    touched: float = field(default_factory=time.monotonic)
    # Set when the upload was dropped: its files are closed and removed once no block is still
    # being written (closing an fd under a writing thread could hand its number to another file).
    dropped: StoreError | None = None

    def missing(self) -> int:
        return sum(
            len(self.upload.files[rel].digest.blocks) - len(got)
            for rel, got in zip(self.upload.order, self.received, strict=True)
        )


class Uploads:
    """The uploads in progress, on top of the keeper's directory."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.staged: dict[str, Staged] = {}
        self.lock = threading.Lock()

    @property
    def incoming(self) -> str:
        return str(self.store.own / "incoming")

    # ---- begin / abort -----------------------------------------------------------------------
    def begin(self, upload: Upload) -> str:
        self.expire()
        free = shutil.disk_usage(self.store.root).free
        if upload.size + FREE_MARGIN > free:
            raise StoreError(507, f"{upload.name} needs {upload.size / 1e6:.1f} MB and the "
                             f"keeper's disk has {free / 1e6:.1f} MB free; give the claim more "
                             "space or keep fewer checkpoints")  # fmt: skip
        with self.lock:
            if len(self.staged) >= MAX_UPLOADS:
                raise StoreError(503, f"{MAX_UPLOADS} uploads in progress; retry")
            txn = uuid.uuid4().hex
            folder = os.path.join(self.incoming, txn)
            os.mkdir(folder)
            staged = Staged(txn, upload, folder, [], [])
            self.staged[txn] = staged
        try:
            for rel in upload.order:
                path = os.path.join(folder, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                staged.fds.append(fd)
                staged.received.append(set())
                os.ftruncate(fd, upload.files[rel].digest.size)
        except OSError as exc:
            self.abort(txn)
            raise storage_error(exc, f"staging {upload.name}") from None
        return txn

    def abort(self, txn: str, cause: StoreError | None = None) -> bool:
        """Drop an upload; blocks still arriving for it are answered with `cause`."""
        with self.lock:
            staged = self.staged.pop(txn, None)
            if staged is None:
                return False
            staged.dropped = cause or StoreError(404, f"upload {txn} was aborted; begin again")
            idle = not staged.receiving
        if idle:
            _release(staged)
        return True

    def expire(self) -> None:
        cutoff = time.monotonic() - IDLE_SECONDS
        with self.lock:
            idle = [t for t, s in self.staged.items() if s.touched < cutoff and not s.receiving]
        for txn in idle:
            self.abort(txn)

    def _get(self, txn: str) -> Staged:
        with self.lock:
            staged = self.staged.get(txn)
        if staged is None:
            raise StoreError(404, f"upload {txn} is unknown (the keeper restarted, or it was "
                             "aborted); begin again")  # fmt: skip
        staged.touched = time.monotonic()
        return staged

    # ---- blocks ------------------------------------------------------------------------------
    def put_block(self, txn: str, file_no: int, block_no: int, body: BinaryIO, length: int) -> None:
        """Receive one block from `body` (exactly `length` bytes), check and write it."""
        staged = self._get(txn)
        if not 0 <= file_no < len(staged.fds):
            raise StoreError(400, f"upload {txn} has no file {file_no}")
        digest = staged.upload.files[staged.upload.order[file_no]].digest
        if not 0 <= block_no < len(digest.blocks):
            raise StoreError(400, f"file {file_no} has no block {block_no}")
        offset, size = digest.span(block_no)
        if length != size:
            raise StoreError(400, f"block {block_no} holds {size} bytes, not {length}")
        with self.lock:
            if (file_no, block_no) in staged.receiving:
                raise StoreError(409, f"block {block_no} of file {file_no} is arriving already")
            staged.receiving.add((file_no, block_no))
        try:
            fd = staged.fds[file_no]
            # not kept in the page cache: the keeper's memory is small and the next read of a
            # checkpoint is a pod's fetch, minutes away (blocks.py)
            got = receive_block(body.readinto, fd, offset, size, digest.algorithm, False)
            if got != digest.blocks[block_no]:
                raise StoreError(422, f"block {block_no} of {staged.upload.order[file_no]} "
                                 "differs from its digest; send it again")  # fmt: skip
            with self.lock:
                staged.received[file_no].add(block_no)
        except OSError as exc:
            if isinstance(exc, (TimeoutError, ConnectionError)):
                raise
            cause = storage_error(exc, f"staging {staged.upload.name}")
            self.abort(txn, cause)  # a full disk: the parts go, every block hears 507
            raise (staged.dropped or cause) from None
        finally:
            with self.lock:
                staged.receiving.discard((file_no, block_no))
                staged.touched = time.monotonic()
                last = staged.dropped is not None and not staged.receiving
            if last:
                _release(staged)
        if staged.dropped is not None:  # dropped while this block arrived
            raise staged.dropped

    # ---- commit ------------------------------------------------------------------------------
    def commit(self, txn: str) -> list[str]:
        """Put the upload in place whole; what pruning removed after it."""
        staged = self._get(txn)
        missing = staged.missing()
        if missing or staged.receiving:
            raise StoreError(409, f"upload {txn} misses {missing} block(s); send them first")
        upload = staged.upload
        try:
            if upload.kind == "unit":
                _check_marker(staged)
            _seal(staged)
            reached("keeper-commit-sealed")
            if upload.kind == "unit":
                self._place_unit(staged)
            else:
                self._place_file(staged)
        except OSError as exc:
            self.abort(txn)
            raise storage_error(exc, f"committing {upload.name}") from None
        with self.lock:
            self.staged.pop(txn, None)
        shutil.rmtree(staged.folder, ignore_errors=True)
        if upload.kind != "unit":
            return []
        return self.store.prune(self.store.keep or upload.keep)

    def _place_unit(self, staged: Staged) -> None:
        name, store = staged.upload.name, self.store
        aside = store.own / "aside" / name
        with store.lock:
            if os.path.lexists(store.root / name):  # the step saved again: the new one wins
                if os.path.lexists(aside):
                    store.throw_away(aside)
                os.rename(store.root / name, aside)
                fsync_dir(aside.parent)
                reached("keeper-commit-aside")
            os.rename(os.path.join(staged.folder, name), store.root / name)
            fsync_dir(store.root)
            reached("keeper-commit-renamed")
            if os.path.lexists(aside):
                store.throw_away(aside)

    def _place_file(self, staged: Staged) -> None:
        rel = staged.upload.name
        parts = rel.split("/")
        parent = self.store.dir_fd(parts[:-1], create=True)
        source = os.open(staged.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            info = os.stat(rel, dir_fd=source, follow_symlinks=False)
            with self.store.lock:
                os.rename(rel, parts[-1], src_dir_fd=source, dst_dir_fd=parent)
            fsync_dir(parent)
            self.store.remember(rel, info, staged.upload.files[rel])
        except IsADirectoryError:
            raise StoreError(409, f"{rel} is a directory here") from None
        finally:
            os.close(source)
            os.close(parent)


def _release(staged: Staged) -> None:
    for fd in staged.fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    shutil.rmtree(staged.folder, ignore_errors=True)


def _check_marker(staged: Staged) -> None:
    """A checkpoint directory holds what its COMPLETE marker says, digest for digest."""
    upload = staged.upload
    marker_no = upload.order.index(f"{upload.name}/{MARKER}")
    text = os.pread(staged.fds[marker_no], 1 << 20, 0).decode(errors="replace")
    try:
        listed = read_marker(text)
    except DigestError as exc:
        raise StoreError(422, f"{upload.name}/{MARKER} is not a marker ({exc})") from None
    for name, digest in (listed or {}).items():
        entry = upload.files.get(f"{upload.name}/{name}")
        if entry is None or entry.digest != digest:
            raise StoreError(422, f"{upload.name}/{name} is not what its {MARKER} marker records; "
                             "the checkpoint is not committed")  # fmt: skip


def _seal(staged: Staged) -> None:
    """Every staged file on the disk with its time, the record beside a checkpoint's files."""
    for rel, fd in zip(staged.upload.order, staged.fds, strict=True):
        mtime = staged.upload.files[rel].mtime_ns
        if mtime:
            os.utime(fd, ns=(mtime, mtime))
        os.fsync(fd)
        os.close(fd)
    staged.fds = []
    upload = staged.upload
    if upload.kind != "unit":
        return
    inside = {rel[len(upload.name) + 1 :]: e for rel, e in upload.files.items()}
    unit_fd = os.open(os.path.join(staged.folder, upload.name), os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_record(unit_fd, staged.id, inside)
        for folder in sorted({os.path.dirname(r) for r in upload.files}, reverse=True):
            fsync_dir(Path(staged.folder, folder))
        fsync_dir(unit_fd)
    finally:
        os.close(unit_fd)
