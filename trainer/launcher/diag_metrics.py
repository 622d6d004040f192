"""The ranks' progress on the pod's /metrics: read from their heartbeat records at scrape
time (nothing is written per step for it), plus the stall watch's verdicts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

from kubeddp.trainer.process_contract import PHASES


class WatchedRecords(Protocol):
    """What the collector reads of the stall watch (stall_watch.StallWatch), named here so
    that this module does not import the watch that imports it."""

    reports: list[Any]

    def records(self) -> list[Any]: ...


class ProgressCollector:
    """A prometheus_client custom collector over the watch's record directory."""

    def __init__(self, watch: WatchedRecords) -> None:
        self.watch = watch
        self._seen = False  # a record was read once: from then on the series are always there

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        records = self.watch.records()
        self._seen = self._seen or bool(records)
        if not self._seen:  # no worker has started yet: nothing to serve (as for metrics.py's)
            return
        now_mono, now_unix = time.monotonic(), time.time()
        step, phase, progress, collectives, busy, straggler, nonfinite = _families()
        for r in records:
            rank = str(r.rank)
            step.add_metric([rank], max(r.step, 0))
            for name in PHASES:
                phase.add_metric([rank, name], 1.0 if name == r.phase else 0.0)
            progress.add_metric([rank], now_unix - (now_mono - r.last_progress))
            collectives.add_metric([rank], r.collectives_started)
            busy.add_metric([rank], r.busy_seconds)
            straggler.add_metric([rank], r.straggler_ratio)
            nonfinite.add_metric([rank], r.nonfinite_step)
        stalls = CounterMetricFamily(
            "kubeddp_stalls", "Stalls the stall watch reported on this pod"
        )
        stalls.add_metric([], len(self.watch.reports))
        yield from (step, phase, progress, collectives, busy, straggler, nonfinite, stalls)


def _families() -> tuple[Any, ...]:
    """The per-rank gauge families, empty."""
    from prometheus_client.core import GaugeMetricFamily

    step = GaugeMetricFamily(
        "kubeddp_rank_step", "Optimizer steps this rank finished", labels=["rank"]
    )
    phase = GaugeMetricFamily(
        "kubeddp_rank_phase", "1 for the phase this rank is in", labels=["rank", "phase"]
    )
    progress = GaugeMetricFamily(
        "kubeddp_rank_last_progress_timestamp_seconds",
        "Unix time of this rank's latest progress (a step, a phase, a collective)",
        labels=["rank"],
    )
    # Gauges, not counters: they start again with each worker process (the series
    # kubeddp counts across restarts are the multiprocess counters of metrics.py).
    collectives = GaugeMetricFamily(
        "kubeddp_rank_collectives",
        "Collectives this rank's current worker process started",
        labels=["rank"],
    )
    busy = GaugeMetricFamily(
        "kubeddp_rank_busy_seconds",
        "Time this rank's current worker process worked in its steps, not waiting for its peers",
        labels=["rank"],
    )
    straggler = GaugeMetricFamily(
        "kubeddp_straggler",
        "This rank's busy time per step over the ranks' median when it is a straggler, else 0",
        labels=["rank"],
    )
    nonfinite = GaugeMetricFamily(
        "kubeddp_nonfinite_step",
        "First step with a non-finite loss or gradient norm on this rank (-1: none)",
        labels=["rank"],
    )
    return step, phase, progress, collectives, busy, straggler, nonfinite
