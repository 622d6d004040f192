"""A pod's in-memory snapshots on disk: two slots in one directory (on /dev/shm, a memory-backed
volume), each a data file of tensor bytes and a meta file written last.

A snapshot goes to the slot that does not hold the newest one: its meta file is removed first,
then the bytes are copied in, their digest taken, and the meta (skeleton, layout, step, digest)
written under a temporary name and renamed over. A kill at any moment therefore leaves the
previous snapshot or the new one whole: a slot without its meta is empty, and a meta whose
digest does not match its bytes is set aside (kept as *.bad, never read again) with one line.

The directory is the pod's (a memory volume) or, on a shared host, one under /dev/shm whose name
anyone can guess: it is made 0700 and used only while it is a real directory of this user that
no one else may enter (`problem`); files in it are opened without following links. The writer
holds its lock (`.lock`) while it runs: a second run on the same directory (two laptop runs with
one checkpoint.dir) writes nothing there, and launch removes a directory only when no one holds it.

No torch.distributed here: which snapshot the job resumes from is restore.py's decision.
"""

from __future__ import annotations

import contextlib
import io
import math
import mmap
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import torch

from kubeddp.trainer import fault_points
from kubeddp.trainer.process_contract import (
    OPEN_NOFOLLOW,
    SNAPSHOT_LOCK,
    snapshot_dir_problem,
    take_snapshot_lock,
)
from kubeddp.trainer.worker.snapshot.flatten import TENSOR_TAG, TensorSlot

FORMAT = "kubeddp-snapshot-v1"
SLOTS = 2
HASH_PIECE = 16 << 20  # hashed a piece at a time: the GIL is free in between
MAX_NBYTES = 1 << 50  # a meta claiming more is not one kubeddp wrote


class SnapshotSpaceError(Exception):
    """The memory for a snapshot is not there: the volume is full or the pod's limit too near."""


class SnapshotContentError(ValueError):
    """The state holds what a snapshot's meta cannot keep (it would not load back)."""


@dataclass
class Held:
    """A published snapshot as its meta describes it (its bytes not yet checked)."""

    index: int
    step: int
    digest: str
    nbytes: int
    slots: list[TensorSlot]
    skeleton: Any
    run: dict[str, Any]
    written: float

    @property
    def key(self) -> tuple[int, str]:
        """What identifies its content across pods: the step and the bytes' digest."""
        return (self.step, self.digest)


@dataclass
class Slot:
    """A slot being written: its index and its data file mapped for writing."""

    index: int
    data: mmap.mmap
    capacity: int
    meta: dict[str, Any] = field(default_factory=dict)


def _read_private(path: Path) -> bytes:
    """A regular file's bytes, without following a link."""
    fd = os.open(path, os.O_RDONLY | OPEN_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("not a regular file")
        return f.read()


def _open_data(path: Path) -> Any:
    fd = os.open(path, os.O_RDONLY | OPEN_NOFOLLOW | os.O_NONBLOCK)
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise ValueError("its data file is not a regular file")
    return f


def _count(value: Any, what: str, most: int = MAX_NBYTES) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"its {what} is not a count: {str(value)[:40]!r}")
    return value


def _tensor_slot(entry: Any) -> TensorSlot:
    if not isinstance(entry, (list, tuple)) or len(entry) != 4:
        raise ValueError("its layout is not kubeddp's")
    offset, nbytes, dtype, shape = entry
    kind = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(kind, torch.dtype) or not isinstance(shape, (list, tuple)):
        raise ValueError(f"its layout names no tensor type: {str(dtype)[:40]!r}")
    dims = tuple(_count(d, "shape") for d in shape)
    slot = TensorSlot(_count(offset, "offset"), _count(nbytes, "size"), dtype, dims)
    if math.prod(dims) * torch.empty((), dtype=kind).element_size() != slot.nbytes:
        raise ValueError(f"its layout gives {slot.nbytes} bytes to a {dtype} of shape {dims}")
    return slot


def _tensor_indices(skeleton: Any) -> list[int]:
    """The tensor indices a skeleton's placeholders name."""
    found: list[int] = []
    stack = [skeleton]
    while stack:
        value = stack.pop()
        if isinstance(value, tuple) and len(value) == 2 and value[0] == TENSOR_TAG:
            found.append(value[1] if isinstance(value[1], int) else -1)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return found


def _held(index: int, raw: dict[str, Any]) -> Held:
    """A meta's record, checked: every field of the type kubeddp writes, every tensor inside
    the data, every placeholder of the skeleton naming one of them."""
    if not isinstance(raw.get("slots"), (list, tuple)) or not isinstance(raw.get("run"), dict):
        raise ValueError("its layout is not kubeddp's")
    slots = [_tensor_slot(entry) for entry in raw["slots"]]
    nbytes = _count(raw.get("nbytes"), "size")
    if any(s.offset + s.nbytes > nbytes for s in slots):
        raise ValueError("its layout runs past its bytes")
    if sorted(_tensor_indices(raw.get("skeleton"))) != list(range(len(slots))):
        raise ValueError("its skeleton does not name its tensors")
    digest, written = raw.get("digest"), raw.get("written")
    if not isinstance(digest, str) or not isinstance(written, float):
        raise ValueError("its digest is not kubeddp's")
    return Held(index, _count(raw.get("step"), "step", 2**62), digest, nbytes, slots,
                raw["skeleton"], dict(raw["run"]), written)  # fmt: skip


def size_text(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.0f} KiB"


def digest_of(buffer: Any, nbytes: int) -> str:
    hasher = blake3.blake3()
    view = memoryview(buffer)
    for start in range(0, nbytes, HASH_PIECE):
        hasher.update(view[start : min(start + HASH_PIECE, nbytes)])
    return hasher.hexdigest()


class SnapshotDir:
    """The two slots of one pod's snapshot directory."""

    def __init__(self, root: Path, log: Callable[[str], None]) -> None:
        self.root = root
        self.log = log
        self._maps: dict[int, mmap.mmap] = {}
        self._lock: int | None = None  # the writer's hold on the directory

    def claim(self) -> str | None:
        """The writer's start: the directory made (0700) and checked, its lock taken; why it
        may not hold snapshots, or None."""
        problem = snapshot_dir_problem(self.root, create=True)
        if problem is None and self._lock is None:
            try:
                self._lock = take_snapshot_lock(self.root)
            except OSError as exc:
                return f"{self.root / SNAPSHOT_LOCK} cannot be opened ({exc.strerror})"
            if self._lock is None:
                problem = (f"another run on this host is using {self.root} (the same "
                           "checkpoint.dir): give each run its own checkpoint.dir")  # fmt: skip
        return problem

    def data_path(self, index: int) -> Path:
        return self.root / f"slot-{index}.data"

    def meta_path(self, index: int) -> Path:
        return self.root / f"slot-{index}.meta"

    # ---- reading -------------------------------------------------------------------------
    def held(self) -> list[Held]:
        """The published snapshots, newest first (their bytes unchecked); a meta that cannot
        be read is set aside."""
        if snapshot_dir_problem(self.root) is not None:
            return []  # never read what another user could have put there
        found = []
        for index in range(SLOTS):
            meta = self.meta_path(index)
            if not os.path.lexists(meta):
                continue
            try:
                found.append(self._read_meta(index))
            except Exception as exc:  # noqa: BLE001 - whatever the bytes are, the slot goes
                why = " ".join(str(exc).split())[:120]
                self.set_aside(index, f"its meta cannot be read ({type(exc).__name__}: {why})")
        return sorted(found, key=lambda held: held.step, reverse=True)

    def _read_meta(self, index: int) -> Held:
        raw = torch.load(
            io.BytesIO(_read_private(self.meta_path(index))), map_location="cpu",
            weights_only=True,
        )  # fmt: skip
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError("not a kubeddp snapshot")
        held = _held(index, raw)
        with _open_data(self.data_path(index)) as data:
            if os.fstat(data.fileno()).st_size < held.nbytes:
                raise ValueError("its data file is shorter than its meta says")
        return held

    def verify(self, held: Held) -> bool:
        """Whether the slot's bytes are the ones its meta's digest names; a mismatch sets the
        slot aside with one line."""
        with _open_data(self.data_path(held.index)) as f:
            if held.nbytes == 0:
                actual = blake3.blake3().hexdigest()
            else:
                with mmap.mmap(f.fileno(), held.nbytes, access=mmap.ACCESS_READ) as view:
                    actual = digest_of(view, held.nbytes)
        if actual == held.digest:
            return True
        self.set_aside(held.index, f"step {held.step}: its bytes do not match their digest")
        return False

    def open_data(self, held: Held) -> mmap.mmap:
        """The slot's bytes, mapped copy-on-write (readers may view them as writable tensors
        without touching the file)."""
        with _open_data(self.data_path(held.index)) as f:
            return mmap.mmap(f.fileno(), max(held.nbytes, 1), access=mmap.ACCESS_COPY)

    def set_aside(self, index: int, why: str, quiet: bool = False) -> None:
        """Keep a bad slot for inspection under *.bad names; it is never read again."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for path in (self.meta_path(index), self.data_path(index)):
            with contextlib.suppress(FileNotFoundError):
                path.rename(path.with_name(f"{path.name}.bad-{stamp}"))
        self._close(index)
        if not quiet:
            self.log(f"[kubeddp] in-memory snapshot in {self.root} set aside: {why}")

    # ---- writing -------------------------------------------------------------------------
    @staticmethod
    def next_index(newest: Held | None) -> int:
        """The slot the next snapshot goes to: the one not holding `newest`."""
        return 0 if newest is None else (newest.index + 1) % SLOTS

    def mapped_bytes(self, index: int) -> int:
        mapped = self._maps.get(index)
        return len(mapped) if mapped is not None else 0

    def begin(self, nbytes: int, newest: Held | None) -> Slot:
        """The slot the next snapshot goes to, emptied and mapped for `nbytes`. Raises
        SnapshotSpaceError when the memory is not there."""
        index = self.next_index(newest)
        problem = self.claim()
        if problem:
            raise SnapshotSpaceError(problem)
        with contextlib.suppress(FileNotFoundError):
            self.meta_path(index).unlink()  # from now on this slot holds nothing
        fault_points.reached("snapshot-emptied")
        mapped = self._maps.get(index)
        if mapped is None or len(mapped) < nbytes:
            self._close(index)
            mapped = self._map(index, max(nbytes, 1))
        return Slot(index, mapped, len(mapped))

    def _map(self, index: int, nbytes: int) -> mmap.mmap:
        path = self.data_path(index)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | OPEN_NOFOLLOW, 0o600)
        try:
            # Reserve the pages now: writing through a map past a full tmpfs is SIGBUS.
            if hasattr(os, "posix_fallocate"):
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                except OSError as exc:
                    os.ftruncate(fd, 0)
                    raise SnapshotSpaceError(
                        f"{self.root} cannot hold {nbytes / 2**20:.1f} MiB more ({exc.strerror})"
                    ) from None
            else:
                os.ftruncate(fd, nbytes)
            mapped = mmap.mmap(fd, nbytes, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        self._maps[index] = mapped
        return mapped

    def publish(self, slot: Slot, nbytes: int, meta: dict[str, Any]) -> Held:
        """Digest the slot's first `nbytes`, then write its meta last."""
        fault_points.reached("snapshot-copied")
        digest = digest_of(slot.data, nbytes)
        fault_points.reached("snapshot-digested")
        record = {**meta, "format": FORMAT, "digest": digest, "nbytes": nbytes,
                  "written": time.time()}  # fmt: skip
        buffer = io.BytesIO()
        torch.save(record, buffer)
        try:  # what restore would read: a state with other objects would be set aside there
            torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch's unpickler names the object
            named = re.search(r"GLOBAL ([\w.]+)", str(exc))
            what = named.group(1) if named else " ".join(str(exc).split())[:120]
            raise SnapshotContentError(
                f"a {what}; a snapshot keeps tensors and plain values (numbers, text, lists, "
                "dicts): make state_dict() return those"
            ) from None
        temp = self.meta_path(slot.index).with_suffix(".meta.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getvalue())
        os.replace(temp, self.meta_path(slot.index))
        fault_points.reached("snapshot-published")
        return _held(slot.index, record)

    def clear(self) -> None:
        """Empty both slots (their metas first: a kill midway leaves nothing half there)."""
        for index in range(SLOTS):
            with contextlib.suppress(FileNotFoundError):
                self.meta_path(index).unlink()
        for index in range(SLOTS):
            self._close(index)
            with contextlib.suppress(FileNotFoundError):
                self.data_path(index).unlink()

    def _close(self, index: int) -> None:
        mapped = self._maps.pop(index, None)
        if mapped is not None:
            with contextlib.suppress(BufferError, ValueError):
                mapped.close()

    def close(self) -> None:
        for index in list(self._maps):
            self._close(index)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
