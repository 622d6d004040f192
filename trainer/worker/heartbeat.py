"""Each rank's progress record: step, phase, collective, in a small mmap'd file per rank.

The launch process (launcher/stall_watch.py) reads these files to see which rank stopped
advancing and what it was doing. A phase change is one `struct.pack_into` into shared memory
(no syscall, no device sync: about 0.3 us), so the loop can mark every phase of every step.
Times are `time.monotonic()` (one clock for every process on the machine).

The same module registers faulthandler on STACKS_SIGNAL: the launcher sends it to a stalled
worker and reads the Python stacks of every thread from the rank's stacks file. faulthandler's
handler runs at C level, so it answers a process stuck in C++ (a gloo or NCCL wait) or one
whose main thread holds the GIL.

Without the directory kubeddp launch exports (KUBEDDP_DIAG_DIR) every call is a no-op.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import signal
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ENV_DIAG_DIR = "KUBEDDP_DIAG_DIR"
STACKS_SIGNAL = signal.SIGUSR1
MAGIC = b"KDHB"
VERSION = 1

# Phases, by their code in the record (the order is the file format: append only).
PHASES = (
    "starting",  # before the first step: nothing is watched yet
    "data",
    "forward/backward",
    "optimizer",
    "checkpoint",
    "eval",
    "collective",
    "step",  # a user program between two report_step calls
    "finished",
)
PHASE_CODE = {name: code for code, name in enumerate(PHASES)}
# Collectives kubeddp counts (the op code is the index; append only).
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
    "all_gather_single",
    "reduce_scatter_single",
)
NONFINITE_WHAT = ("loss", "gradient norm")
_OPTIMIZER = PHASE_CODE["optimizer"]

# Fields and their offsets (the record is RECORD_SIZE bytes; readers check MAGIC and VERSION).
_HEADER = struct.Struct("<4sIqQ")  # magic, version, pid, main thread id
_STEP = struct.Struct("<qd")  # step, when it ended
_PHASE = struct.Struct("<i4xd")  # phase, since
_COLLECTIVE = struct.Struct("<qqi4xd")  # started, done, op, since
_NONFINITE = struct.Struct("<qi4x")  # first non-finite step (-1: none), what
_BUSY = struct.Struct("<d")  # seconds this rank worked in its steps (not waiting for peers)
_STRAGGLER = struct.Struct("<d")  # 0, or its busy time over the median (straggler verdict)
_OP_COUNT = struct.Struct("<q")  # one per op in COLLECTIVES: how many this rank started
_STEP_AT, _PHASE_AT, _COLLECTIVE_AT, _NONFINITE_AT = 24, 40, 56, 88
_BUSY_AT, _STRAGGLER_AT, _OP_COUNTS_AT = 104, 112, 120
RECORD_SIZE = _OP_COUNTS_AT + 8 * 16  # room for 16 ops


def this_pod() -> str:
    """`pod P, node N` (the downward API's names; the host name outside Kubernetes)."""
    import socket

    from kubeddp.trainer import constants

    pod = os.environ.get(constants.ENV_POD_NAME) or socket.gethostname()
    node = os.environ.get(constants.ENV_NODE_NAME)
    return f"pod {pod}, node {node}" if node else f"pod {pod}"


def record_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.hb"


def stacks_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.stacks"


@dataclass(frozen=True)
class RankRecord:
    """One rank's record as read by another process."""

    rank: int
    pid: int
    main_thread: int
    step: int
    step_at: float
    phase: str
    phase_since: float
    collectives_started: int
    collectives_done: int
    collective_op: str
    collective_since: float
    nonfinite_step: int
    nonfinite_what: str
    busy_seconds: float
    straggler_ratio: float
    op_counts: tuple[int, ...]  # per op of COLLECTIVES

    @property
    def last_progress(self) -> float:
        """The latest sign of life the rank itself wrote."""
        return max(self.step_at, self.phase_since, self.collective_since)

    @property
    def in_collective(self) -> bool:
        return self.collectives_started > self.collectives_done


def read_record(path: Path) -> RankRecord | None:
    """The record at `path`; None when it is missing, short or not (yet) a record."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < RECORD_SIZE:
        return None
    magic, version, pid, thread = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        return None
    step, step_at = _STEP.unpack_from(data, _STEP_AT)
    phase, phase_since = _PHASE.unpack_from(data, _PHASE_AT)
    started, done, op, coll_since = _COLLECTIVE.unpack_from(data, _COLLECTIVE_AT)
    bad_step, bad_what = _NONFINITE.unpack_from(data, _NONFINITE_AT)
    (busy,) = _BUSY.unpack_from(data, _BUSY_AT)
    (straggler,) = _STRAGGLER.unpack_from(data, _STRAGGLER_AT)
    rank = int(path.stem.split("-", 1)[1])
    return RankRecord(
        rank=rank,
        pid=pid,
        main_thread=thread,
        step=step,
        step_at=step_at,
        phase=PHASES[phase] if 0 <= phase < len(PHASES) else "?",
        phase_since=phase_since,
        collectives_started=started,
        collectives_done=done,
        collective_op=COLLECTIVES[op] if 0 <= op < len(COLLECTIVES) else "",
        collective_since=coll_since,
        nonfinite_step=bad_step,
        nonfinite_what=NONFINITE_WHAT[bad_what] if 0 <= bad_what < len(NONFINITE_WHAT) else "",
        busy_seconds=busy,
        straggler_ratio=straggler,
        op_counts=struct.unpack_from(f"<{len(COLLECTIVES)}q", data, _OP_COUNTS_AT),
    )


class Heartbeat:
    """This rank's writer; every method is a no-op when `enabled` is false."""

    def __init__(self, directory: str | None, rank: int) -> None:
        self.enabled = bool(directory) and os.path.isdir(directory or "")
        self.step = -1
        self.started = self.done = 0
        self.op_counts = [0] * len(COLLECTIVES)
        self.busy = 0.0
        # The time this rank's last gradient bucket was ready (DDP comm hook): from then until
        # backward returns it waits for its peers; that wait is not its own work.
        self.sync_ready = 0.0
        self._sync_wait = 0.0
        self._stacks: IO[str] | None = None
        if not self.enabled:
            return
        assert directory is not None
        path = record_path(directory, rank)
        tmp = path.with_suffix(".tmp")
        # Written whole, then renamed: a reader never sees a half-made header.
        with open(tmp, "wb") as f:
            f.write(bytes(RECORD_SIZE))
        fd = os.open(tmp, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, RECORD_SIZE)
        finally:
            os.close(fd)
        now = time.monotonic()
        _STEP.pack_into(self._map, _STEP_AT, -1, now)
        _PHASE.pack_into(self._map, _PHASE_AT, PHASE_CODE["starting"], now)
        _COLLECTIVE.pack_into(self._map, _COLLECTIVE_AT, 0, 0, -1, 0.0)
        _NONFINITE.pack_into(self._map, _NONFINITE_AT, -1, 0)
        ident = threading.main_thread().ident or 0
        _HEADER.pack_into(self._map, 0, MAGIC, VERSION, os.getpid(), ident)
        os.replace(tmp, path)
        self._stacks = open(stacks_path(directory, rank), "a")  # noqa: SIM115 (kept open)
        faulthandler.register(STACKS_SIGNAL, file=self._stacks, all_threads=True, chain=False)
        from kubeddp.trainer.worker import flight_recorder

        flight_recorder.start_responder(directory, rank)

    def phase(self, code: int) -> None:
        """Enter a phase (a code from PHASE_CODE)."""
        if self.enabled:
            now = time.monotonic()
            if code == _OPTIMIZER and self.sync_ready:  # backward returned: the sync is over
                self._sync_wait, self.sync_ready = now - self.sync_ready, 0.0
            _PHASE.pack_into(self._map, _PHASE_AT, code, now)

    def step_done(self, step: int, next_phase: int, seconds: float | None = None) -> None:
        """A step of `seconds` ended; the rank moves on to `next_phase`."""
        if self.enabled:
            now = time.monotonic()
            self.step = step
            if seconds is not None:
                self.busy += max(0.0, seconds - self._sync_wait)
                self._sync_wait = 0.0
                _BUSY.pack_into(self._map, _BUSY_AT, self.busy)
            _STEP.pack_into(self._map, _STEP_AT, step, now)
            _PHASE.pack_into(self._map, _PHASE_AT, next_phase, now)

    def straggler(self, ratio: float) -> None:
        """This rank's straggler verdict: its busy time over the median, 0 when it is none."""
        if self.enabled:
            _STRAGGLER.pack_into(self._map, _STRAGGLER_AT, ratio)

    def collective_start(self, op: int) -> None:
        if self.enabled:
            self.started += 1
            self.op_counts[op] += 1
            _OP_COUNT.pack_into(self._map, _OP_COUNTS_AT + 8 * op, self.op_counts[op])
            _COLLECTIVE.pack_into(
                self._map, _COLLECTIVE_AT, self.started, self.done, op, time.monotonic()
            )

    def collective_end(self, op: int) -> None:
        if self.enabled:
            self.done += 1
            _COLLECTIVE.pack_into(
                self._map, _COLLECTIVE_AT, self.started, self.done, op, time.monotonic()
            )

    def nonfinite(self, step: int, what: str) -> None:
        if self.enabled:
            _NONFINITE.pack_into(self._map, _NONFINITE_AT, step, NONFINITE_WHAT.index(what))

    def close(self) -> None:
        global _THIS
        if _THIS is self:  # the next this_rank() makes a fresh one (a later trainer's)
            _THIS = None
        if self.enabled:
            self.phase(PHASE_CODE["finished"])
            faulthandler.unregister(STACKS_SIGNAL)
            if self._stacks is not None:
                self._stacks.close()
            self.enabled = False


_THIS: Heartbeat | None = None


def this_rank() -> Heartbeat:
    """This process's heartbeat (made on first use from the environment)."""
    global _THIS
    if _THIS is None:
        _THIS = Heartbeat(os.environ.get(ENV_DIAG_DIR), int(os.environ.get("RANK", "0")))
    return _THIS
