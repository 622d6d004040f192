"""Taking a pod's in-memory snapshots while training goes on.

Every rank calls `take` at the same steps (a collective: the ranks' own parts, such as their
RNG streams, are gathered, so every pod's snapshot can restore any rank). The pod's writer
(local rank 0) copies the state into the slot: what the next optimizer step changes
(parameters, optimizer state) in the background, on a side stream on CUDA, and the rest at
once; the next optimizer step waits for that copy (a step pre-hook). The digest and the meta
follow in the background thread. How often: every `every_steps`, or with 0 as often as keeps
the cost (the time the loop waited plus the background's CPU time) under 1% of the training
time, measured at every snapshot and agreed by all ranks (the largest interval any asks for).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kubeddp.trainer import process_contract
from kubeddp.trainer.config import CheckpointConfig
from kubeddp.trainer.worker.distributed import gather_objects
from kubeddp.trainer.worker.snapshot import flatten, memory
from kubeddp.trainer.worker.snapshot.restore import Restored, agree
from kubeddp.trainer.worker.snapshot.slots import (
    Held,
    Slot,
    SnapshotDir,
    SnapshotSpaceError,
    size_text,
)

BUDGET = 0.01  # the share of training time snapshots may cost
FIRST_AFTER_STEPS = 2  # the first snapshot, after the start's slow steps
MAX_AUTO_EVERY = 10_000


@dataclass(frozen=True)
class Published:
    """What the metrics and the log say of a snapshot once it is whole."""

    step: int
    nbytes: int
    seconds: float  # from the step boundary to the meta written
    every: int
    timestamp: float


class SnapshotTaker:
    """This rank's part in the job's in-memory snapshots."""

    def __init__(
        self,
        root: Path,
        *,
        writer: bool,
        every_steps: int,
        device: torch.device,
        log: Callable[[str], None],
        on_published: Callable[[Published], None] | None = None,
        run: dict[str, Any] | None = None,
        group: Any = None,
    ) -> None:
        self.directory = SnapshotDir(root, log)  # written by the node's writer, read by all
        self.is_writer = writer
        self.fixed_every = every_steps  # 0: auto
        self.every = max(every_steps, 1)
        self.device = device
        self.log = log
        self.on_published = on_published
        self.run = dict(run or {})
        self.enabled = True
        self.next_step: int | None = None
        # this pod's newest published snapshot: the next one goes to the other slot
        self.newest: Held | None = next(iter(self.directory.held()), None) if writer else None
        self._pool = ThreadPoolExecutor(1, "kubeddp-snapshot") if writer else None
        self._job: Future | None = None
        self._copied = threading.Event()
        self._copied.set()
        self._copy_event: Any = None  # CUDA: what the next update waits for on its stream
        self._staging: dict[int, torch.Tensor] = {}  # CUDA: pinned buffers, by slot index
        self._hooks: list[Any] = []
        self.group = group  # the snapshots' own collectives: a gloo group beside NCCL
        # The last snapshot's cost: the loop's CPU time in take(), its wait before the next
        # update, the background thread's CPU time (waiting in the gather is not counted: the
        # rank would wait as long in the step's own all-reduce)
        self._take_cpu = self._gate_wait = self._background_cpu = 0.0
        self._last_take: tuple[int, float] | None = None  # step, wall time
        self._step_seconds: float | None = None
        self._published = 0

    # ---- at start ------------------------------------------------------------------------
    def restore(
        self, durable_step: int | None, run_problem: Callable[[dict[str, Any]], str | None]
    ) -> Restored | None:
        """Collective: the newest state any rank holds (restore.agree), or None."""
        restored = agree(self.directory, self.is_writer, durable_step, run_problem,
                         self.device, self.log)  # fmt: skip
        if restored is not None and self.is_writer:
            self.newest = next((h for h in self.directory.held() if h.step == restored.step), None)
        return restored

    def forget(self) -> None:
        """A run that starts afresh (checkpoint.resume=never): the snapshots of the one before
        are no one's now."""
        if self.is_writer:
            self.directory.clear()

    # ---- cadence -------------------------------------------------------------------------
    def start(self, step: int) -> None:
        self.next_step = step + (self.fixed_every or FIRST_AFTER_STEPS)

    def due(self, step: int) -> bool:
        return self.enabled and self.next_step is not None and step >= self.next_step

    def _proposal(self) -> int:
        """The interval this rank asks for: its measured cost over 1% of a step's time."""
        if self.fixed_every or not self._step_seconds:
            return self.every
        cost = self._take_cpu + self._gate_wait + self._background_cpu
        wanted = math.ceil(cost / (BUDGET * self._step_seconds))
        return min(max(wanted, 1), MAX_AUTO_EVERY)

    def _timed_step(self, step: int) -> None:
        """A step's wall time since the last snapshot: the throughput the budget protects. (A
        step's CPU time would shrink the budget wherever a step waits: on the GPU, on peers, on
        the data loader; 1% of wall costs up to 2% of CPU where ranks share their cores.)"""
        now = time.perf_counter()
        if self._last_take is not None and step > self._last_take[0]:
            self._step_seconds = max(now - self._last_take[1], 1e-6) / (step - self._last_take[0])
        self._last_take = (step, now)

    # ---- the update's wait ---------------------------------------------------------------
    def guard(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Make each optimizer's step wait for the background copy of what it changes."""
        for optimizer in optimizers:
            self._hooks.append(optimizer.register_step_pre_hook(self._before_update))

    def _before_update(self, *_: Any) -> None:
        if self._copy_event is not None:  # CUDA: the stream waits, not the host
            torch.cuda.current_stream(self.device).wait_event(self._copy_event)
            self._copy_event = None
        if not self._copied.is_set():
            start = time.perf_counter()
            self._copied.wait()
            self._gate_wait += time.perf_counter() - start

    # ---- taking one ----------------------------------------------------------------------
    def take(
        self,
        step: int,
        state: Callable[[], dict[str, Any]],
        own_parts: dict[str, Any],
        updated: Iterable[torch.Tensor],
    ) -> None:
        """Collective: every rank at the same step. `state`: the job-wide state (the writer
        calls it), `own_parts`: this rank's own parts (gathered into the snapshot),
        `updated`: the tensors the next optimizer step changes (copied in the background)."""
        start, cpu = time.perf_counter(), time.thread_time()
        self._timed_step(step)
        self.wait()
        proposal = self._proposal()
        self._take_cpu = self._gate_wait = self._background_cpu = 0.0
        gathered = gather_objects((own_parts, proposal, self.enabled), self.group)
        self.every = self.fixed_every or max(proposal for _, proposal, _ in gathered)
        self.next_step = step + self.every
        if not all(enabled for _, _, enabled in gathered):
            self.enabled = False  # a pod that cannot hold them: no rank waits for snapshots
        if self.is_writer and self.enabled:
            full = state()
            for name in own_parts:
                full[name] = [parts[name] for parts, _, _ in gathered]
            self._write(step, full, {t.data_ptr() for t in updated}, start)
        self._take_cpu = time.thread_time() - cpu

    def _write(self, step: int, full: dict[str, Any], updated: set[int], start: float) -> None:
        assert self._pool is not None
        skeleton, tensors = flatten.split(full)
        slots, nbytes = flatten.layout(tensors)
        try:
            slot = self._slot(nbytes)
        except SnapshotSpaceError as exc:
            self._give_up(str(exc))
            return
        later = [i for i, t in enumerate(tensors) if t.data_ptr() in updated]
        now = [i for i, t in enumerate(tensors) if t.data_ptr() not in updated]
        table = [(s.offset, s.nbytes, s.dtype, list(s.shape)) for s in slots]
        meta = {"step": step, "slots": table, "skeleton": skeleton, "run": self.run}
        if self.device.type == "cuda":
            ready = self._copy_cuda(slot, tensors, slots, now, later)
        else:
            self._copy(_in_map(slot, slots), tensors, slots, now)
            ready = None
        self._copied.clear()
        job = (slot, tensors, slots, later, ready, nbytes, meta, start)
        self._job = self._pool.submit(self._finish, *job)

    def _slot(self, nbytes: int) -> Slot:
        grow = nbytes - self.directory.mapped_bytes(self.directory.next_index(self.newest))
        if grow > 0:
            problem = memory.space_problem(self.directory.root, grow)
            if problem:
                raise SnapshotSpaceError(problem)
        return self.directory.begin(nbytes, self.newest)

    @staticmethod
    def _copy(target: Callable[[int], torch.Tensor], tensors: list[torch.Tensor],
              slots: list[flatten.TensorSlot], which: list[int]) -> None:  # fmt: skip
        """Each tensor in `which` into `target(i)`, its bytes' place in the snapshot."""
        for i in which:
            if slots[i].nbytes:
                target(i).copy_(flatten.as_bytes(tensors[i]), non_blocking=True)

    def _copy_cuda(self, slot: Slot, tensors: list[torch.Tensor], slots: list,
                   now: list[int], later: list[int]) -> list[Any]:  # fmt: skip
        """Into pinned buffers: what the next forward may change on the training stream now,
        the rest on a side stream; the update waits for the side stream's event."""
        staging = self._staging.get(slot.index)
        if staging is None or staging.numel() < slot.capacity:
            staging = torch.empty(slot.capacity, dtype=torch.uint8, pin_memory=True)
            self._staging[slot.index] = staging
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        on_main = [i for i in now if tensors[i].is_cuda]
        pinned = _in_tensor(staging, slots)
        self._copy(pinned, tensors, slots, on_main)
        main_done = torch.cuda.Event()
        main_done.record(main)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            self._copy(pinned, tensors, slots, later)
        side_done = torch.cuda.Event()
        side_done.record(side)
        self._copy_event = side_done
        host = [i for i in now if not tensors[i].is_cuda]
        self._copy(_in_map(slot, slots), tensors, slots, host)
        return [main_done, side_done, staging, [i for i in now + later if tensors[i].is_cuda]]

    def _finish(self, slot: Slot, tensors: list[torch.Tensor], slots: list, later: list[int],
                ready: list[Any] | None, nbytes: int, meta: dict[str, Any],
                start: float) -> None:  # fmt: skip
        """The background part: the copy the update waits for, then digest and meta."""
        cpu_start = time.thread_time()
        try:
            if ready is None:
                self._copy(_in_map(slot, slots), tensors, slots, later)
            else:
                main_done, side_done, staging, on_device = ready
                self._copied.set()  # the update waits on the side stream's event instead
                main_done.synchronize()
                side_done.synchronize()
                in_map, pinned = _in_map(slot, slots), _in_tensor(staging, slots)
                for i in on_device:
                    in_map(i).copy_(pinned(i))
            self._copied.set()
            del tensors
            self.newest = self.directory.publish(slot, nbytes, meta)
        except OSError as exc:
            self._give_up(f"{type(exc).__name__}: {exc}")
            return
        finally:
            self._copied.set()
        self._background_cpu = time.thread_time() - cpu_start
        self._published += 1
        if self._published == 2:  # the first interval chosen from a measured cost
            how = "checkpoint.memory_every_steps" if self.fixed_every else "auto: 1% of step time"
            self.log(f"[kubeddp] in-memory snapshots: every {self.every} steps ({how}), "
                     f"{size_text(nbytes)} each, in {self.directory.root}")  # fmt: skip
        if self.on_published is not None:
            seconds = time.perf_counter() - start
            self.on_published(Published(meta["step"], nbytes, seconds, self.every, time.time()))

    def _give_up(self, why: str) -> None:
        if self.enabled:
            self.log(f"[kubeddp] in-memory snapshots off for this run: {why}")
        self.enabled = False

    def wait(self) -> None:
        """The snapshot in flight, whole (or given up)."""
        job, self._job = self._job, None
        if job is not None:
            job.result()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.wait()
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.directory.close()


def _in_map(slot: Slot, slots: list[flatten.TensorSlot]) -> Callable[[int], torch.Tensor]:
    """Tensor i's bytes in the slot's mapped data file."""
    return lambda i: flatten.from_buffer(slot.data, flatten.as_byte_slot(slots[i]))


def _in_tensor(
    buffer: torch.Tensor, slots: list[flatten.TensorSlot]
) -> Callable[[int], torch.Tensor]:
    """Tensor i's bytes in a staging buffer laid out as the slot."""
    return lambda i: buffer[slots[i].offset : slots[i].offset + slots[i].nbytes]


def updated_by(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """What an optimizer's step changes in place: its parameters and their state."""
    if optimizer is None:
        return []
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    for state in optimizer.state.values():
        tensors.extend(value for value in state.values() if isinstance(value, torch.Tensor))
    return tensors


def for_worker(
    settings: CheckpointConfig,
    device: torch.device,
    run: dict[str, Any],
    log: Callable[[str], None],
    on_published: Callable[[Published], None] | None = None,
) -> SnapshotTaker | None:
    """This rank's snapshot taker (the node's writer when it is local rank 0), or None when
    checkpoint.memory_snapshots is off. Collective where the job trains on NCCL: the
    snapshots' own collectives get a gloo group, so taking one never waits for the GPU."""
    if not settings.memory_snapshots:
        return None
    node = int(os.environ.get("GROUP_RANK", "0"))
    root = process_contract.snapshot_root(settings.dir, node, os.environ)
    writer = os.environ.get("LOCAL_RANK", "0") == "0"
    group = None
    if dist.is_initialized() and dist.get_backend() != "gloo":
        group = dist.new_group(backend="gloo")
    return SnapshotTaker(root, writer=writer, every_steps=settings.memory_every_steps,
                         device=device, log=log, on_published=on_published, run=run,
                         group=group)  # fmt: skip
