"""Rendezvous rounds of a static job whose pods rejoin: every pod agrees on the round's id and
port through node rank 0's store (real TCPStores on 127.0.0.1, one thread per pod)."""

from __future__ import annotations

import threading

import pytest

from kubeddp.trainer.launcher.rejoin import RendezvousRounds, RoundTimeout
from kubeddp.trainer.launcher.rendezvous import RendezvousPlan
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(60)


def plan(rank: int, port: int, nnodes: str = "2", backend: str = "static") -> RendezvousPlan:
    return RendezvousPlan(
        source="flags", nnodes=nnodes, nproc_per_node=1, node_rank=rank, rdzv_backend=backend,
        rdzv_endpoint=f"127.0.0.1:{port}", world_size=int(nnodes) if nnodes.isdigit() else None,
    )  # fmt: skip


def rounds_of(pods: list[RendezvousRounds]) -> list[tuple[str, int]]:
    """Each pod arrives in its own thread; what each one was told."""
    got: list[tuple[str, int] | None] = [None] * len(pods)

    def arrive(i: int) -> None:
        got[i] = pods[i].next_round(lambda _: None)

    threads = [threading.Thread(target=arrive, args=(i,)) for i in range(len(pods))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(g is not None for g in got), got
    return [g for g in got if g is not None]


def test_every_pod_gets_the_same_fresh_round_each_time() -> None:
    port = free_port()
    pods = [RendezvousRounds(plan(rank, port), 20) for rank in (0, 1)]
    assert rounds_of(pods) == [("kubeddp-round-0", port + 1)] * 2
    # A lost pod's peer and its replacement (a new process: a new client) meet in round 1.
    pods[1] = RendezvousRounds(plan(1, port), 20)
    assert rounds_of(pods) == [("kubeddp-round-1", port + 2)] * 2


def test_a_round_that_not_every_pod_joins_times_out() -> None:
    port = free_port()
    host = RendezvousRounds(plan(0, port), 1)
    with pytest.raises(RoundTimeout, match="not every one of the 2 pods joined"):
        host.next_round(lambda _: None)


@pytest.mark.parametrize(
    ("nnodes", "backend", "applies"),
    [("2", "static", True), ("1", "static", False), ("1:3", "c10d", False)],
)
def test_rounds_apply_to_static_multi_node_plans_only(
    nnodes: str, backend: str, applies: bool
) -> None:
    p = plan(0, 29500, nnodes, backend)
    if not nnodes.isdigit():
        p.node_rank = None
    assert RendezvousRounds.applies(p) is applies
