"""Stopping every rank at the same step: after SIGTERM (preemption) or a failed save; and
saving at the same step when one rank's clock says checkpoint.every_seconds passed.

A rank that stops (or saves) alone leaves the others hanging in their next collective, so each
step the ranks vote (all_reduce MAX of their stop reasons and save wishes) and all act on the
result together.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from kubeddp.trainer import exit_codes

STOP_NONE, STOP_PREEMPT, STOP_SAVE_FAILED = 0, 1, 2


# The signals that stop training with a checkpoint, and the exit code each ends with: SIGTERM
# (preemption, drain, docker stop) is retried by the operators; Ctrl-C is the user's own stop.
STOP_SIGNALS = {signal.SIGTERM: exit_codes.PREEMPTED, signal.SIGINT: exit_codes.INTERRUPTED}


class Preempted(SystemExit):
    """Raised after the stop checkpoint is saved: 143 after SIGTERM (retryable), 130 after
    Ctrl-C."""

    def __init__(self, code: int = exit_codes.PREEMPTED) -> None:
        super().__init__(code)


def start_grace_timer(seconds: float, signame: str = "SIGTERM", code: int = 0) -> None:
    """Exit `seconds` after the stop signal even if its save has not finished (a step or a
    collective may hang): the previous checkpoint is intact, and a later SIGKILL would not
    say why."""

    def expire() -> None:
        print(
            f"[kubeddp] {signame}: no checkpoint within checkpoint.preempt_grace_seconds="
            f"{seconds:g}; exiting without it (the previous checkpoint is kept)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(code or exit_codes.PREEMPTED)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


# Steps between casting a vote and acting on it. Every rank reads the same vote at the same
# step, so all stop together; a stop lands at most this many steps after SIGTERM.
VOTE_LAG_STEPS = 2


class _Ballot:
    """One step's vote: the flags the ranks all-reduce (the stop reason, a save wish), and
    where the result reaches the host.

    On CUDA the result is copied to pinned host memory behind an event one step after the
    vote, and read one step later still, when the event has (almost always) completed: the
    host never waits for the step that is running. On CPU the flag is host memory already.
    """

    def __init__(self, device: torch.device) -> None:
        self.flag = torch.zeros(2, dtype=torch.int32, device=device)
        on_cuda = device.type == "cuda"
        self.host = torch.zeros(2, dtype=torch.int32, pin_memory=True) if on_cuda else self.flag
        self.event = torch.cuda.Event() if on_cuda else None
        self.work: Any = None
        self.copied = False

    def cast(self, local: int, save: bool) -> None:
        self.flag[0].fill_(local)  # a kernel on CUDA; torch.tensor(..., device=) would sync
        self.flag[1].fill_(int(save))
        self.work = dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, async_op=True)
        self.copied = False

    def to_host(self) -> None:
        """Queue the result's trip to the host (CUDA: the stream waits, the host does not)."""
        if self.copied:
            return
        self.work.wait()
        if self.event is not None:
            self.host.copy_(self.flag, non_blocking=True)
            self.event.record()
        self.copied = True

    def result(self) -> tuple[int, bool]:
        self.to_host()
        if self.event is not None:
            self.event.synchronize()  # recorded a step ago: returns at once unless far behind
        stop, save = self.host.numpy().tolist()
        return int(stop), bool(save)


class StopVote:
    """This rank's reason to stop, and the vote that makes all ranks agree on it.

    Every step each rank casts its vote (all_reduce MAX, in the background) and acts on the
    vote cast VOTE_LAG_STEPS steps earlier, so neither a blocking round trip (~1.5 ms with
    gloo, measured by tests/bench) nor a wait for the GPU is on the step's path. The ballots
    are reused in a ring: no allocation per step.
    """

    def __init__(self, device: torch.device, distributed: bool, grace_seconds: float) -> None:
        self.device = device
        self.distributed = distributed
        self.grace_seconds = grace_seconds
        self.sigterm = False  # a stop signal arrived (SIGTERM or SIGINT)
        self.signal_name = "SIGTERM"
        self.exit_code = exit_codes.PREEMPTED
        self._ring: list[_Ballot] = []
        self._in_flight: deque[_Ballot] = deque()  # cast, not yet read; oldest first

    def on_sigterm(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if not self.sigterm:
            self.sigterm = True
            self.signal_name = signal.Signals(signum).name
            self.exit_code = STOP_SIGNALS.get(signum, exit_codes.PREEMPTED)
            start_grace_timer(self.grace_seconds, self.signal_name, self.exit_code)

    @contextlib.contextmanager
    def catching_sigterm(self) -> Iterator[None]:
        """SIGTERM and SIGINT become this rank's stop vote while training (main thread only:
        Python runs signal handlers there): Ctrl-C saves like a preemption, no traceback."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.on_sigterm) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def vote(self, reason: int, save: bool = False) -> tuple[int, bool]:
        """Cast this step's vote (SIGTERM wins over `reason`; `save`: this rank wants a save);
        return the result of the vote cast VOTE_LAG_STEPS steps ago (the strongest stop
        reason, and whether any rank wanted a save; nothing during the first steps)."""
        local = STOP_PREEMPT if self.sigterm else reason
        if not self.distributed:
            return local, save
        if not self._ring:
            self._ring = [_Ballot(self.device) for _ in range(VOTE_LAG_STEPS + 1)]
        ballot = self._ring.pop(0)  # free: its result was read VOTE_LAG_STEPS - 1 steps ago
        self._ring.append(ballot)
        ballot.cast(local, save)
        if self._in_flight:
            self._in_flight[-1].to_host()  # the previous step's vote, finished by now
        self._in_flight.append(ballot)
        if len(self._in_flight) > VOTE_LAG_STEPS:
            return self._in_flight.popleft().result()
        return STOP_NONE, False

    def drain(self) -> int:
        """Wait for the votes still in flight (before a save, or when leaving the loop); the
        strongest of them."""
        results = [ballot.result()[0] for ballot in self._in_flight]
        self._in_flight.clear()
        return max(results, default=STOP_NONE)
