"""Rendezvous rounds of a static job whose pods rejoin: every pod agrees on the round's id and
port through node rank 0's store (real TCPStores on 127.0.0.1, one thread per pod); a pod that
arrives for the next round stops the workers (real child processes) of the pods still in this
one."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from kubeddp.trainer.launcher.rejoin import RendezvousRounds, RoundTimeout
from kubeddp.trainer.launcher.rendezvous import RendezvousPlan
from kubeddp.trainer.launcher.round_watch import WATCH_SECONDS, RoundWatch, worker_pids
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


# ---- the round watch (launcher/round_watch.py) ------------------------------------------
SLEEPER = "import time; time.sleep(60)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', "
    "flush=True); time.sleep(60)"
)


def worker(code: str) -> subprocess.Popen[bytes]:
    """A stand-in for a worker torch's agent started: a child in a session of its own."""
    return subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE
    )


def alive(proc: subprocess.Popen[bytes]) -> Callable[[], list[int]]:
    return lambda: [proc.pid] if proc.poll() is None else []


def in_round_0(port: int) -> list[RendezvousRounds]:
    pods = [RendezvousRounds(plan(rank, port), 5) for rank in (0, 1)]
    assert rounds_of(pods) == [("kubeddp-round-0", port + 1)] * 2
    return pods


def arrive_for_next_round(pod: RendezvousRounds) -> threading.Thread:
    """The pod's agent returned: it arrives for the next round and waits there (no one else
    comes: its wait ends with RoundTimeout, which nobody needs here)."""

    def arrive() -> None:
        with contextlib.suppress(RoundTimeout):
            pod.next_round(lambda _: None)

    thread = threading.Thread(target=arrive, daemon=True)
    thread.start()
    return thread


def test_a_pod_arriving_for_the_next_round_stops_the_workers_of_those_still_in_this_one() -> None:
    pods = in_round_0(free_port())
    with contextlib.ExitStack() as stack:
        proc = worker(SLEEPER)
        stack.callback(proc.kill)
        said: list[str] = []
        watch = stack.enter_context(RoundWatch(pods[0], 30, said.append, alive(proc)))
        assert pods[0].later_arrivals(pods[0].watch_client()) == 0
        time.sleep(2 * WATCH_SECONDS)
        assert proc.poll() is None and watch.stopped_at is None  # nobody left the round
        before = time.time()
        arrive_for_next_round(pods[1])
        assert proc.wait(10) == -signal.SIGTERM
        assert watch.stopped_at is not None and watch.stopped_at >= before
        assert pods[0].later_arrivals(pods[0].watch_client()) == 1
    assert said == ["[kubeddp] a pod left rendezvous round 0 (1 arrived for round 1): stopping "
                    "this pod's workers to rejoin"]  # fmt: skip


def test_a_worker_that_ignores_sigterm_is_killed_after_the_shutdown_timeout() -> None:
    pods = in_round_0(free_port())
    proc = worker(STUBBORN)
    try:
        with RoundWatch(pods[0], 1, lambda _: None, alive(proc)):
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            arrive_for_next_round(pods[1])
            assert proc.wait(15) == -signal.SIGKILL
    finally:
        proc.kill()


def test_a_round_that_ends_with_no_one_leaving_stops_nothing() -> None:
    pods = in_round_0(free_port())
    proc = worker(SLEEPER)
    try:
        with RoundWatch(pods[0], 1, lambda _: None, alive(proc)) as watch:
            time.sleep(2 * WATCH_SECONDS)
        arrive_for_next_round(pods[1])  # after the agent returned: this pod's next round
        time.sleep(2 * WATCH_SECONDS)
        assert proc.poll() is None and watch.stopped_at is None
    finally:
        proc.kill()


def test_the_workers_are_the_children_of_the_launch_process() -> None:
    proc = worker(SLEEPER)
    try:
        assert proc.pid in worker_pids()
        assert worker_pids(proc.pid) == []
    finally:
        proc.kill()
