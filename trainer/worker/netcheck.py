"""The network check: all-reduces at a few sizes over the whole job, then node-to-node exchanges
between one representative rank per node, paired by a round-robin tournament (netcheck_plan.py).

Collective on every rank. Every rank runs the same number of operations: the repeat count of
each measurement comes from its warm-up run, the slowest rank's (an all-reduce MAX), and the
time left of network.check_seconds. Each measurement runs at least once: the check can only
overrun its budget by one measurement on a very slow network.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from kubeddp.trainer.config import NetworkConfig
from kubeddp.trainer.worker.distributed import DistContext, gather_objects
from kubeddp.trainer.worker.netcheck_plan import (
    CheckResult,
    Link,
    Member,
    bus_bandwidth,
    fits,
    judge,
    message_sizes,
    pair_message,
    representatives,
    size_text,
    tournament,
)

MAX_REPEATS = 50
BUS_SHARE = 0.5  # of check_seconds: the all-reduces; the rest: the node pairs


class _Clock:
    """Wall time of device work: the host waits for the device before reading the clock."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def slowest(self, seconds: float) -> float:
        """The largest of every rank's `seconds` (collective)."""
        box = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
        return float(box.item())


def _repeats(warm_seconds: float, budget: float) -> int:
    if warm_seconds <= 0:
        return MAX_REPEATS
    return max(1, min(MAX_REPEATS, int(budget / warm_seconds)))


def measure_bus(
    ctx: DistContext, sizes: list[int], budget: float, clock: _Clock
) -> tuple[dict[int, float], str]:
    """All-reduce bus bandwidth per message size (bytes -> bytes/s), smallest first. A size
    that would not end within the budget at the bandwidth of the one before is skipped, with
    the larger ones, and the note says so (the same decision on every rank: the times it
    rests on are every rank's slowest)."""
    out: dict[int, float] = {}
    if ctx.world_size < 2:
        return out, "one rank: nothing to measure"
    start = clock.now()
    for i, nbytes in enumerate(sizes):
        elapsed = clock.slowest(clock.now() - start)
        if i and not fits(elapsed, nbytes, out[sizes[i - 1]], ctx.world_size, budget):
            return out, f"{size_text(nbytes)} and up skipped to keep to network.check_seconds"
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
        t0 = clock.now()
        dist.all_reduce(buf)  # warm-up: connects NCCL's paths, and times one run
        warm = clock.slowest(clock.now() - t0)
        share = (budget - clock.slowest(clock.now() - start)) / (len(sizes) - i)
        dist.barrier()
        t0 = clock.now()
        reps = _repeats(warm, share)
        for _ in range(reps):
            dist.all_reduce(buf)
        seconds = clock.slowest(clock.now() - t0) / reps
        out[nbytes] = bus_bandwidth(nbytes, seconds, ctx.world_size)
    return out, ""


def _exchange(buf_out: torch.Tensor, buf_in: torch.Tensor, peer: int) -> None:
    ops = [dist.P2POp(dist.isend, buf_out, peer), dist.P2POp(dist.irecv, buf_in, peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def measure_pairs(
    ctx: DistContext, members: list[Member], nbytes: int, budget: float, clock: _Clock
) -> list[Link]:
    """Each node pair's bandwidth (one direction, both sending at once), from the median
    exchange time of its two representatives; every rank takes part in the rounds' barriers."""
    reps = representatives(members)
    rounds = tournament(len(reps))
    mine = {m.rank for m in reps}
    buf_out = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
    buf_in = torch.empty_like(buf_out)
    timed: dict[tuple[int, int], float] = {}
    for pairs in rounds:
        peer = _peer(ctx.rank, pairs, reps) if ctx.rank in mine else None
        dist.barrier()
        t0 = clock.now()
        if peer is not None:
            _exchange(buf_out, buf_in, peer)  # warm-up, and the time of one exchange
        warm = clock.slowest(clock.now() - t0 if peer is not None else 0.0)
        count = _repeats(warm, budget / len(rounds))
        samples = []
        for _ in range(count if peer is not None else 0):
            t0 = clock.now()
            _exchange(buf_out, buf_in, peer)
            samples.append(clock.now() - t0)
        if peer is not None:
            key = tuple(sorted((ctx.rank, peer)))
            timed[key] = statistics.median(samples)  # type: ignore[index]
    return _links(gather_objects(timed), reps, nbytes)


def _peer(rank: int, pairs: list[tuple[int, int]], reps: list[Member]) -> int | None:
    for a, b in pairs:
        if reps[a].rank == rank:
            return reps[b].rank
        if reps[b].rank == rank:
            return reps[a].rank
    return None


def _links(timings: list[dict[Any, float]], reps: list[Member], nbytes: int) -> list[Link]:
    """Per pair the slower side's median time (both sides measure the same exchanges)."""
    by_rank = {m.rank: m for m in reps}
    seconds: dict[tuple[int, int], float] = {}
    for timing in timings:
        for key, value in timing.items():
            seconds[key] = max(value, seconds.get(key, 0.0))
    return [
        Link(by_rank[a], by_rank[b], nbytes / s if s > 0 else 0.0)
        for (a, b), s in sorted(seconds.items())
    ]


def run_check(
    cfg: NetworkConfig, ctx: DistContext, members: list[Member], log: Callable[[str], None]
) -> CheckResult:
    """Measure; rank 0 logs the result. Collective."""
    clock = _Clock(ctx.device)
    nodes = len({m.node_rank for m in members})
    result = CheckResult(ctx.world_size, nodes)
    start = clock.now()
    sizes = message_sizes(cfg.check_max_mb)
    result.bus, result.cut_short = measure_bus(ctx, sizes, cfg.check_seconds * BUS_SHARE, clock)
    links: list[Link] = []
    if nodes > 1:
        largest = max(result.bus)
        spent = clock.slowest(clock.now() - start)
        left = max(cfg.check_seconds - spent, cfg.check_seconds * (1 - BUS_SHARE) / 2)
        rounds = len(tournament(nodes))
        result.pair_bytes = pair_message(largest, result.bus[largest], rounds, left)
        links = measure_pairs(ctx, members, result.pair_bytes, left, clock)
    result.verdict = judge(links, cfg.slow_factor)
    result.seconds = clock.slowest(clock.now() - start)
    if ctx.is_main:
        log(result.describe())
        slow = result.slow_line(cfg.slow_factor)
        if slow:
            log(slow)
    return result
