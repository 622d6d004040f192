"""The ranks' progress on the pod's /metrics: read from their heartbeat records at scrape time
(nothing is written per step for it), plus the stall watch's verdicts.

By default each rank has one series (the time of its latest progress, while it trains) and a
series of its own only for a verdict against it (a straggler, a non-finite step); with
metrics.per_rank every rank's step, phase, collectives and busy time too (docs/metrics.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kubeddp.trainer.process_contract import PHASES

# Phases in which a rank is not watched: before its first step and after its last.
IDLE_PHASES = ("starting", "finished")


class WatchedRecords(Protocol):
    """What the collector reads of the stall watch (stall_watch.StallWatch), named here so
    that this module does not import the watch that imports it."""

    reports: list[Any]

    def records(self) -> list[Any]: ...


class ProgressCollector:
    """A prometheus_client custom collector over the watch's record directory."""

    def __init__(self, watch: WatchedRecords, per_rank: bool = False) -> None:
        self.watch = watch
        self.per_rank = per_rank
        self._seen = False  # a record was read once: from then on the series are always there

    def collect(self) -> Iterator[Any]:
        records = self.watch.records()
        self._seen = self._seen or bool(records)
        if not self._seen:  # no worker has started yet: nothing to serve (as for metrics.py's)
            return
        now_mono, now_unix = time.monotonic(), time.time()
        progress, straggler, nonfinite = _families()
        for r in records:
            rank = str(r.rank)
            if r.phase not in IDLE_PHASES:
                progress.add_metric([rank], now_unix - (now_mono - r.last_progress))
            if r.straggler_ratio > 0:
                straggler.add_metric([rank], r.straggler_ratio)
            if r.nonfinite_step >= 0:
                nonfinite.add_metric([rank], r.nonfinite_step)
        stalls = CounterMetricFamily(
            "kubeddp_stalls", "Stalls the stall watch reported on this pod"
        )
        stalls.add_metric([], len(self.watch.reports))
        yield from (progress, straggler, nonfinite, stalls)
        if self.per_rank:
            yield from _per_rank(records)


def _families() -> tuple[Any, ...]:
    """The default per-rank families, empty."""
    progress = GaugeMetricFamily(
        "kubeddp_rank_last_progress_timestamp_seconds",
        "Unix time of this rank's latest progress (a step, a phase, a collective) while it "
        "trains; no series before its first step or after its last",
        labels=["rank"],
    )
    straggler = GaugeMetricFamily(
        "kubeddp_straggler_ratio",
        "This rank's busy time per step over the other ranks' median; only for a rank judged a "
        "straggler (over diagnostics.straggler_factor)",
        labels=["rank"],
    )
    nonfinite = GaugeMetricFamily(
        "kubeddp_nonfinite_step",
        "First step with a non-finite loss or gradient norm on this rank; only once there is one",
        labels=["rank"],
    )
    return progress, straggler, nonfinite


def _per_rank(records: list[Any]) -> Iterator[Any]:
    """metrics.per_rank: each rank's step, phase, collectives and busy time."""
    step = GaugeMetricFamily(
        "kubeddp_rank_step", "Optimizer steps this rank finished", labels=["rank"]
    )
    phase = GaugeMetricFamily(
        "kubeddp_rank_phase", "1 for the phase this rank is in", labels=["rank", "phase"]
    )
    # Counters of the rank's current worker process: they start again at 0 with each worker
    # restart, which Prometheus' rate() and increase() read as a counter reset.
    collectives = CounterMetricFamily(
        "kubeddp_rank_collectives",
        "Collectives this rank's current worker process started",
        labels=["rank"],
    )
    busy = CounterMetricFamily(
        "kubeddp_rank_busy_seconds",
        "Time this rank's current worker process worked in its steps, not waiting for its peers",
        labels=["rank"],
    )
    for r in records:
        rank = str(r.rank)
        step.add_metric([rank], max(r.step, 0))
        for name in PHASES:
            phase.add_metric([rank, name], 1.0 if name == r.phase else 0.0)
        collectives.add_metric([rank], r.collectives_started)
        busy.add_metric([rank], r.busy_seconds)
    yield from (step, phase, collectives, busy)
