"""Each rank's progress record: step, phase, collective, in a small mmap'd file per rank.

The launch process (launcher/stall_watch.py) reads these files to see which rank stopped
advancing and what it was doing. A phase change is one `struct.pack_into` into shared memory
(no syscall, no device sync: about 0.3 us), so the loop can mark every phase of every step.
The record's layout, its file names and its reader are the process contract's
(trainer/process_contract.py); this module is the rank's writer.

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
import threading
import time
from typing import IO

from kubeddp.trainer.process_contract import (
    BUSY_AT,
    BUSY_FIELDS,
    COLLECTIVE_AT,
    COLLECTIVE_FIELDS,
    COLLECTIVES,
    ENV_DIAG_DIR,
    HEADER_FIELDS,
    MAGIC,
    NONFINITE_AT,
    NONFINITE_FIELDS,
    NONFINITE_WHAT,
    OP_COUNT_FIELDS,
    OP_COUNTS_AT,
    PHASE_AT,
    PHASE_CODE,
    PHASE_FIELDS,
    RECORD_SIZE,
    STACKS_SIGNAL,
    STEP_AT,
    STEP_FIELDS,
    STRAGGLER_AT,
    STRAGGLER_FIELDS,
    VERSION,
    record_path,
    stacks_path,
)

_OPTIMIZER = PHASE_CODE["optimizer"]


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
        STEP_FIELDS.pack_into(self._map, STEP_AT, -1, now)
        PHASE_FIELDS.pack_into(self._map, PHASE_AT, PHASE_CODE["starting"], now)
        COLLECTIVE_FIELDS.pack_into(self._map, COLLECTIVE_AT, 0, 0, -1, 0.0)
        NONFINITE_FIELDS.pack_into(self._map, NONFINITE_AT, -1, 0)
        ident = threading.main_thread().ident or 0
        HEADER_FIELDS.pack_into(self._map, 0, MAGIC, VERSION, os.getpid(), ident)
        os.replace(tmp, path)
        self._stacks = open(stacks_path(directory, rank), "a")  # noqa: SIM115 (kept open)
        faulthandler.register(STACKS_SIGNAL, file=self._stacks, all_threads=True, chain=False)
        # 54 modules, only once the stacks file is open: `kubeddp train --help` imports this module
        from kubeddp.trainer.worker import flight_recorder

        flight_recorder.start_responder(directory, rank)

    def phase(self, code: int) -> None:
        """Enter a phase (a code from PHASE_CODE)."""
        if self.enabled:
            now = time.monotonic()
            if code == _OPTIMIZER and self.sync_ready:  # backward returned: the sync is over
                self._sync_wait, self.sync_ready = now - self.sync_ready, 0.0
            PHASE_FIELDS.pack_into(self._map, PHASE_AT, code, now)

    def step_done(self, step: int, next_phase: int, seconds: float | None = None) -> None:
        """A step of `seconds` ended; the rank moves on to `next_phase`."""
        if self.enabled:
            now = time.monotonic()
            self.step = step
            if seconds is not None:
                self.busy += max(0.0, seconds - self._sync_wait)
                self._sync_wait = 0.0
                BUSY_FIELDS.pack_into(self._map, BUSY_AT, self.busy)
            STEP_FIELDS.pack_into(self._map, STEP_AT, step, now)
            PHASE_FIELDS.pack_into(self._map, PHASE_AT, next_phase, now)

    def straggler(self, ratio: float) -> None:
        """This rank's straggler verdict: its busy time over the median, 0 when it is none."""
        if self.enabled:
            STRAGGLER_FIELDS.pack_into(self._map, STRAGGLER_AT, ratio)

    def collective_start(self, op: int) -> None:
        if self.enabled:
            self.started += 1
            self.op_counts[op] += 1
            OP_COUNT_FIELDS.pack_into(self._map, OP_COUNTS_AT + 8 * op, self.op_counts[op])
            COLLECTIVE_FIELDS.pack_into(
                self._map, COLLECTIVE_AT, self.started, self.done, op, time.monotonic()
            )

    def collective_end(self, op: int) -> None:
        if self.enabled:
            self.done += 1
            COLLECTIVE_FIELDS.pack_into(
                self._map, COLLECTIVE_AT, self.started, self.done, op, time.monotonic()
            )

    def nonfinite(self, step: int, what: str) -> None:
        if self.enabled:
            NONFINITE_FIELDS.pack_into(self._map, NONFINITE_AT, step, NONFINITE_WHAT.index(what))

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
