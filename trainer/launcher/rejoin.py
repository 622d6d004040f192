"""Rendezvous rounds for a static job whose pods rejoin instead of failing.

When a pod is lost, its peers stay up and start torchrun's agent again (pod.py); the lost
pod's replacement starts one for the first time. torch's static rendezvous keeps its keys in the
node-rank-0 pod's store under the rendezvous id, so a second round under the same id reads the
first round's keys (its workers' store port, among others) and hangs. Every round therefore gets
its own id, which all pods agree on without talking to each other first: launch on node rank 0
holds the store for the pod's whole life (torchrun's agent reuses it: multi-tenant, same port),
every pod counts its arrival there, and arrival n belongs to round (n - 1) // nnodes. The last
arrival of a round opens it. Node rank 0 arrives only after its previous agent has returned.
The round's agent (and the workers, which share the agent's store) then run on a port of
their own, the rendezvous port + 1 + round % ROUND_PORTS: a fresh store each round, so nothing
of the previous round (the workers' addresses under torch's `/worker/attempt_0` prefix) is read
again. When node rank 0 itself is lost, its store goes with it: the replacement starts a new
store and everyone counts from zero again. The pods must reach each other on those ports.
An arrival beyond a round's last comes from a pod that left it: round_watch.py stops the
workers of the pods that were not told.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeddp.trainer.launcher.rendezvous_plan import RendezvousPlan

PREFIX = "kubeddp/rejoin"
RETRY_SECONDS = 2.0
WATCH_TIMEOUT_SECONDS = 10.0  # a look at the arrivals (round_watch.py) taking longer: store gone
ROUND_PORTS = 16  # rounds use the rendezvous port + 1 .. + ROUND_PORTS, in turn
# What a call on node rank 0's store raises while that store is gone (its pod replaced)
STORE_ERRORS = (RuntimeError, ValueError, TimeoutError, ConnectionError)


class RoundTimeout(TimeoutError):
    """Not every pod arrived for the round in time."""


class RendezvousRounds:
    """The rounds of one static job, seen from one pod."""

    def __init__(self, plan: RendezvousPlan, deadline_seconds: float) -> None:
        self.plan = plan
        self.nnodes = int(plan.nnodes)
        self.is_host = plan.node_rank == 0
        self.deadline_seconds = deadline_seconds
        self._store: Any = None
        self._held: Any = None  # node rank 0: the store that outlives each agent
        self.number = -1  # the round this pod is in (next_round), -1 before the first

    @staticmethod
    def applies(plan: RendezvousPlan) -> bool:
        return (
            plan.rdzv_backend == "static"
            and not plan.standalone
            and plan.node_rank is not None
            and plan.nnodes.isdigit()
            and int(plan.nnodes) > 1
        )

    def _connect(self) -> Any:
        # torch: `kubeddp train --help` imports this module and must not import torch
        # (tests/unit/test_torchrun_args.py)
        from torch.distributed import TCPStore

        timeout = timedelta(seconds=self.deadline_seconds)
        if self.is_host and self._held is None:
            self._held = TCPStore(
                self.plan.host, self.plan.port, is_master=True, wait_for_workers=False,
                multi_tenant=True, timeout=timeout,
            )  # fmt: skip
            return self._held
        if self.is_host:
            return self._held
        return TCPStore(
            self.plan.host, self.plan.port, is_master=False, wait_for_workers=False,
            timeout=timeout,
        )  # fmt: skip

    def next_round(self, log: Callable[[str], None]) -> tuple[str, int]:
        """Arrive, wait until every pod of this round arrived; the round's rendezvous id and
        the port its agent store uses."""
        gc.collect()  # the previous agent's stores and sockets, before anyone is let in
        end = time.monotonic() + self.deadline_seconds
        while True:
            try:
                store = self._store = self._connect()
                arrival = int(store.add(f"{PREFIX}/arrivals", 1))
                break
            except STORE_ERRORS as exc:
                # node rank 0 is being replaced: its store is gone and the new one not up yet
                if time.monotonic() > end:
                    raise RoundTimeout(
                        f"could not reach the rendezvous store at {self.plan.rdzv_endpoint} "
                        f"within {self.deadline_seconds:g}s ({exc})"
                    ) from None
                time.sleep(RETRY_SECONDS)
        number = (arrival - 1) // self.nnodes
        key = f"{PREFIX}/round-{number}"
        if arrival == (number + 1) * self.nnodes:
            store.set(key, "open")
        else:
            log(f"[kubeddp] waiting for every pod to join rendezvous round {number}")
            try:
                store.wait([key], timedelta(seconds=max(1.0, end - time.monotonic())))
            except (RuntimeError, TimeoutError) as exc:
                raise RoundTimeout(
                    f"not every one of the {self.nnodes} pods joined rendezvous round {number} "
                    f"within {self.deadline_seconds:g}s ({exc})"
                ) from None
        self.number = number
        port = self.plan.port + 1 + number % ROUND_PORTS
        return f"{self.plan.rdzv_id}-round-{number}", port

    def watch_client(self) -> Any:
        """A connection of its own to node rank 0's store, for round_watch.py's thread: a
        short timeout, and nothing shared with the rounds' own calls."""
        from torch.distributed import TCPStore  # see _connect

        return TCPStore(
            self.plan.host, self.plan.port, is_master=False, wait_for_workers=False,
            timeout=timedelta(seconds=WATCH_TIMEOUT_SECONDS),
        )  # fmt: skip

    def later_arrivals(self, store: Any) -> int:
        """How many pods arrived for rounds after this pod's (`store`: a watch_client): each
        of them left this round."""
        arrivals = int(store.add(f"{PREFIX}/arrivals", 0))
        return max(0, arrivals - (self.number + 1) * self.nnodes)
