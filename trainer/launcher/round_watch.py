"""A round whose group is already broken ends on every pod, not only on those its failure reached.

When a pod is lost mid-round its peers usually learn it from a collective that fails. A worker
waiting anywhere else never does: in a store wait at start-up (a gloo connect, a subgroup
made for a snapshot transfer, all under the 30-minute start-up timeout), in a data loader, in
a barrier whose partner is waiting too. Its pod would never arrive for the next round, and the
pods that did would wait out the round's deadline, exit and be recreated after the Job
controller's growing back-off (CI saw a 32-pod job lose 15 minutes so).

Arriving for the next round is the signal (torch's own agent restarts its workers when a
dynamic rendezvous reports a node waiting; the static one never does): the last arrival of a
round fills it, so any arrival beyond it came from a pod that left this round. While the
round's agent runs, this pod looks at the arrival count in node rank 0's store every
WATCH_SECONDS; when a later arrival shows, it stops its workers as the agent stops them on a
preemption: SIGTERM to each worker's process group (a worker saving a stop checkpoint finishes
it), SIGKILL to those still there after the shutdown timeout (a worker stuck in native code
never runs its handler). The agent then returns with the group failed, and the pod rejoins.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kubeddp.trainer.common import proc_stat
from kubeddp.trainer.launcher.rejoin import STORE_ERRORS

if TYPE_CHECKING:
    from kubeddp.trainer.launcher.rejoin import RendezvousRounds

WATCH_SECONDS = 1.0  # how often a pod looks for an arrival of the next round
STOP_CHECK_SECONDS = 0.5  # after the stop: how often it looks for workers to signal


def worker_pids(parent: int | None = None) -> list[int]:
    """The processes `parent` (this one) started: in a launch, the agent's workers (Linux;
    elsewhere none, and the agent's own timeouts remain)."""
    parent = os.getpid() if parent is None else parent
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = proc_stat(entry.name)  # None: it ended meanwhile
        if fields and len(fields) > 1 and fields[1] == str(parent):  # field 4: the parent
            pids.append(int(entry.name))
    return sorted(pids)


def signal_worker(pid: int, sig: int) -> None:
    """`sig` to the worker and what it started (torch starts each worker in a session of its
    own and stops it with killpg), or to the worker alone when it leads no group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


class RoundWatch:
    """While the round's agent runs (`with`): stop this pod's workers once a pod arrived for the
    next round. `stopped_at` (time.time()) is when it did, None while it has not: a worker that
    failed from then on was stopped, it did not fail on its own."""

    def __init__(
        self,
        rounds: RendezvousRounds,
        shutdown_seconds: float,
        log: Callable[[str], None],
        pids: Callable[[], list[int]] = worker_pids,
    ) -> None:
        self.rounds = rounds
        self.shutdown_seconds = shutdown_seconds
        self.log = log
        self.pids = pids
        self.stopped_at: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubeddp-round-watch", daemon=True)

    def __enter__(self) -> RoundWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            store = self.rounds.watch_client()
            later = 0
            while not later and not self._done.wait(WATCH_SECONDS):
                later = self.rounds.later_arrivals(store)
        except STORE_ERRORS:  # node rank 0's store is gone: its workers (rank 0's) too,
            return  # so every group fails on its own
        if not later:
            return  # the agent returned first
        self.stopped_at = time.time()
        number = self.rounds.number
        self.log(
            f"[kubeddp] a pod left rendezvous round {number} ({later} arrived for round "
            f"{number + 1}): stopping this pod's workers to rejoin"
        )
        self._stop()

    def _stop(self) -> None:
        """SIGTERM each worker as it shows (the agent may still be starting them), SIGKILL
        those still there `shutdown_seconds` later; until the agent returns."""
        termed: dict[int, float] = {}
        while True:
            now = time.monotonic()
            for pid in self.pids():
                if pid not in termed:
                    termed[pid] = now
                    signal_worker(pid, signal.SIGTERM)
                elif now - termed[pid] > self.shutdown_seconds:
                    signal_worker(pid, signal.SIGKILL)
            if self._done.wait(STOP_CHECK_SECONDS):
                return
