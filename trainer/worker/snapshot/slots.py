"""A pod's in-memory snapshots on disk: two slots in one directory (on /dev/shm, a memory-backed
volume), each a data file of tensor bytes and a meta file written last.

A snapshot goes to the slot that does not hold the newest one: its meta file is removed first,
then the bytes are copied in, their digest taken, and the meta (skeleton, layout, step, digest)
written under a temporary name and renamed over. A kill at any moment therefore leaves the
previous snapshot or the new one whole: a slot without its meta is empty, and a meta whose
digest does not match its bytes is set aside (kept as *.bad, never read again) with one line.

No torch.distributed here: which snapshot the job resumes from is restore.py's decision.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import torch

from kubeddp.trainer import fault_points
from kubeddp.trainer.worker.snapshot.flatten import TensorSlot

FORMAT = "kubeddp-snapshot-v1"
SLOTS = 2
HASH_PIECE = 16 << 20  # hashed a piece at a time: the GIL is free in between


class SnapshotSpaceError(Exception):
    """The memory for a snapshot is not there: the volume is full or the pod's limit too near."""


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


def _held(index: int, raw: dict[str, Any]) -> Held:
    slots = [TensorSlot(int(o), int(n), str(d), tuple(int(x) for x in s))
             for o, n, d, s in raw["slots"]]  # fmt: skip
    return Held(index, int(raw["step"]), str(raw["digest"]), int(raw["nbytes"]), slots,
                raw["skeleton"], dict(raw["run"]), float(raw["written"]))  # fmt: skip


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

    def data_path(self, index: int) -> Path:
        return self.root / f"slot-{index}.data"

    def meta_path(self, index: int) -> Path:
        return self.root / f"slot-{index}.meta"

    # ---- reading -------------------------------------------------------------------------
    def held(self) -> list[Held]:
        """The published snapshots, newest first (their bytes unchecked); a meta that cannot
        be read is set aside."""
        found = []
        for index in range(SLOTS):
            meta = self.meta_path(index)
            if not meta.exists():
                continue
            try:
                found.append(self._read_meta(index))
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
                self.set_aside(index, f"its meta cannot be read ({type(exc).__name__})")
        return sorted(found, key=lambda held: held.step, reverse=True)

    def _read_meta(self, index: int) -> Held:
        raw = torch.load(
            io.BytesIO(self.meta_path(index).read_bytes()), map_location="cpu", weights_only=True
        )
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError("not a kubeddp snapshot")
        held = _held(index, raw)
        if any(s.offset < 0 or s.nbytes < 0 or s.offset + s.nbytes > held.nbytes
               for s in held.slots):  # fmt: skip
            raise ValueError("its layout runs past its bytes")
        data = self.data_path(index)
        if not data.exists() or data.stat().st_size < held.nbytes:
            raise ValueError("its data file is shorter than its meta says")
        return held

    def verify(self, held: Held) -> bool:
        """Whether the slot's bytes are the ones its meta's digest names; a mismatch sets the
        slot aside with one line."""
        with open(self.data_path(held.index), "rb") as f:
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
        with open(self.data_path(held.index), "rb") as f:
            return mmap.mmap(f.fileno(), max(held.nbytes, 1), access=mmap.ACCESS_COPY)

    def set_aside(self, index: int, why: str) -> None:
        """Keep a bad slot for inspection under *.bad names; it is never read again."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for path in (self.meta_path(index), self.data_path(index)):
            with contextlib.suppress(FileNotFoundError):
                path.rename(path.with_name(f"{path.name}.bad-{stamp}"))
        self._close(index)
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
        self.root.mkdir(parents=True, exist_ok=True)
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
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
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
        temp = self.meta_path(slot.index).with_suffix(".meta.tmp")
        temp.write_bytes(buffer.getvalue())
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
