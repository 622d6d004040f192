"""Where a job resumes from when its workers start: the newest state any rank holds.

Each pod's writer (local rank 0) offers the newest snapshot in its memory that belongs to this
run and whose bytes match their digest; rank 0 adds the newest durable checkpoint it lists. All
ranks see every offer (one gather) and agree: the highest step wins, a snapshot in memory over a
durable checkpoint of the same step (no storage read). The lowest rank that holds it sends it to
the writer of every pod that does not (a pod recreated with empty memory), over the process
group, into that pod's own snapshot slot; then every rank loads it from its pod's memory.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from kubeddp.trainer import fault_points
from kubeddp.trainer.worker.distributed import gather_objects
from kubeddp.trainer.worker.snapshot import flatten
from kubeddp.trainer.worker.snapshot.slots import Held, SnapshotDir, size_text

CHUNK_BYTES = 64 << 20  # sent a piece at a time: bounded device memory on NCCL


@dataclass(frozen=True)
class Offer:
    """What one rank brings to the agreement."""

    rank: int
    writer: bool  # its pod's snapshot writer (local rank 0)
    pod: str
    key: tuple[int, str] | None  # (step, digest) of its pod's newest usable snapshot
    durable_step: int | None  # rank 0: the newest durable checkpoint it lists


@dataclass(frozen=True)
class Restored:
    state: dict[str, Any]
    step: int
    source: str  # memory://POD/rank-R: the memory of rank R, on pod POD
    received: bool  # this pod's memory had it not: a peer sent it


class SnapshotTransferError(RuntimeError):
    """A snapshot sent by a peer did not arrive whole (its digest differs)."""


def usable_here(directory: SnapshotDir, run_problem: Callable[[dict[str, Any]], str | None],
                log: Callable[[str], None]) -> Held | None:  # fmt: skip
    """The newest snapshot in this pod's memory that belongs to this run and is whole."""
    for held in directory.held():
        problem = run_problem(held.run)
        if problem:
            log(f"[kubeddp] in-memory snapshot of step {held.step} not used: {problem}")
            continue
        if directory.verify(held):
            return held
    return None


def agree(
    directory: SnapshotDir,
    writer: bool,
    durable_step: int | None,
    run_problem: Callable[[dict[str, Any]], str | None],
    device: torch.device,
    log: Callable[[str], None],
) -> Restored | None:
    """Collective: the newest state any rank holds, loaded on every rank from its pod's
    memory; None when a durable checkpoint is newer or no rank holds a snapshot."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = usable_here(directory, run_problem, log) if writer else None
    offer = Offer(rank, writer, socket.gethostname(), mine.key if mine else None, durable_step)
    offers: list[Offer] = gather_objects(offer)
    durable = offers[0].durable_step
    keys = [o.key for o in offers if o.key is not None]
    if not keys:
        return None
    best = max(keys)
    if durable is not None and durable > best[0]:
        return None
    source = min(o.rank for o in offers if o.key == best)
    needy = [o.rank for o in offers if o.writer and o.key != best]
    if needy:
        _send(directory, mine, best, source, needy, rank, device)
    if dist.is_initialized():
        dist.barrier()  # every pod's writer has published it: its local ranks may read it
    held = next((h for h in directory.held() if h.key == best), None)
    if held is None:
        raise SnapshotTransferError(f"the snapshot of step {best[0]} is not in {directory.root}")
    pod = next(o.pod for o in offers if o.rank == source)
    return Restored(load(directory, held), best[0], memory_source(pod, source), rank in needy)


def memory_source(pod: str, rank: int) -> str:
    """Where a resume came from, in the log line every resume writes ("resumed from WHERE (step
    N, ...)"), as a durable checkpoint's path or URL would be."""
    return f"memory://{pod}/rank-{rank}"


def load(directory: SnapshotDir, held: Held) -> dict[str, Any]:
    """The state a held snapshot stands for, its tensors copied out of the mapping."""
    data = directory.open_data(held)
    try:
        tensors = [flatten.from_buffer(data, slot).clone() for slot in held.slots]
    finally:
        data.close()
    return flatten.join(held.skeleton, tensors)


def _send(directory: SnapshotDir, mine: Held | None, best: tuple[int, str], source: int,
          needy: list[int], rank: int, device: torch.device) -> None:  # fmt: skip
    """The source's snapshot into every needy pod writer's slot (collective over all ranks:
    each takes part in making the group)."""
    members = sorted({source, *needy})
    group = dist.new_group(members)
    if rank not in members:
        return
    meta: list[Any] = [None]
    if rank == source:
        assert mine is not None
        meta[0] = {"step": mine.step, "nbytes": mine.nbytes, "skeleton": mine.skeleton,
                   "run": mine.run, "slots": [(s.offset, s.nbytes, s.dtype, list(s.shape))
                                              for s in mine.slots]}  # fmt: skip
    dist.broadcast_object_list(meta, src=source, group=group)
    info = meta[0]
    nbytes = int(info["nbytes"])
    if rank == source:
        assert mine is not None
        data = directory.open_data(mine)
        try:
            _broadcast_bytes(data, nbytes, source, group, device)
        finally:
            data.close()
        return
    own = directory.held()
    start = time.perf_counter()
    slot = directory.begin(nbytes, own[0] if own else None)
    _broadcast_bytes(slot.data, nbytes, source, group, device)
    fault_points.reached("snapshot-received")
    held = directory.publish(
        slot, nbytes, {k: info[k] for k in ("step", "skeleton", "run", "slots")}
    )
    if held.key != best:
        directory.set_aside(held.index, f"step {best[0]} from rank {source} arrived damaged")
        raise SnapshotTransferError(
            f"the in-memory snapshot of step {best[0]} sent by rank {source} arrived damaged "
            "(its digest differs); the pod restarts and asks again"
        )
    print(
        f"[kubeddp] this pod's memory had no snapshot of step {best[0]}: received it from "
        f"rank {source} ({size_text(nbytes)} in {time.perf_counter() - start:.1f} s)",
        flush=True,
    )


def _broadcast_bytes(buffer: Any, nbytes: int, source: int, group: Any,
                     device: torch.device) -> None:  # fmt: skip
    """`nbytes` of `buffer` from `source` to the group, a piece at a time (through the device
    on NCCL, which sends device memory only)."""
    for start in range(0, nbytes, CHUNK_BYTES):
        count = min(CHUNK_BYTES, nbytes - start)
        view = torch.frombuffer(buffer, dtype=torch.uint8, count=count, offset=start)
        if device.type == "cuda":
            piece = view.to(device)
            dist.broadcast(piece, src=source, group=group)
            view.copy_(piece.cpu())
        else:
            dist.broadcast(view, src=source, group=group)
        fault_points.reached("snapshot-piece")
