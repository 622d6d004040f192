"""The pod's /metrics view of its workers: every worker's metrics file merged at scrape time.

Each worker process writes one file (worker/metrics.py; process_contract.read_worker_metrics
reads them all); the files of dead workers stay. Each family of worker/metrics.py FAMILIES is
served as its `merge` says: counters and histograms summed over every file, so they go on from
their totals after a restart; gauges from the newest file, so a restarted run's step replaces
the killed one's; one series per rank from that rank's newest file. Only prometheus_client's
public custom-collector API is used (`prometheus_client.core` metric families).

`per_rank` (metrics.per_rank) labels the step-time histogram by rank; by default it is one
histogram per pod, the sum of its ranks' observations (docs/metrics.md: series per pod).
A user's program's own prometheus_client metrics (multiprocess `*.db` files in the same
directory) are served beside them by UserMetricsCollector.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector

from kubeddp.trainer.process_contract import read_worker_metrics
from kubeddp.trainer.worker.metrics import (
    FAMILIES,
    INFO,
    INFO_LABELS,
    RANK_INFO,
    RANK_INFO_LABELS,
    STEP_SECONDS,
    Family,
)

Record = dict[str, Any]


class WorkerMetricsCollector:
    """A prometheus_client custom collector over the workers' files in `directory`."""

    def __init__(self, directory: str, per_rank: bool = False) -> None:
        self.directory = directory
        self.per_rank = per_rank

    def collect(self) -> Iterator[Metric]:
        records = read_worker_metrics(self.directory)
        if not records:  # no worker has started yet: nothing to serve
            return
        records.sort(key=lambda r: float(r.get("written", 0.0)))  # oldest first
        for family in FAMILIES:
            metric = self._family(family, records)
            if metric is not None:
                yield metric

    def _family(self, family: Family, records: list[Record]) -> Metric | None:
        if family is INFO:
            return _info(family, list(INFO_LABELS), [records[-1].get("info", {})])
        if family is RANK_INFO:
            newest = _newest_per_rank(records)
            labels = [{"rank": rank, **r.get("rank_info", {})} for rank, r in newest.items()]
            return _info(family, ["rank", *RANK_INFO_LABELS], labels)
        if family.kind == "histogram":
            return self._histogram(family, records)
        if family.merge == "rank":
            out = GaugeMetricFamily(family.name, family.doc, labels=["rank"])
            for rank, r in _newest_per_rank(records).items():
                value = r.get("rank_values", {}).get(family.name)
                if value is not None:
                    out.add_metric([rank], float(value))
            return out if out.samples else None
        values = [float(r["values"][family.name]) for r in records
                  if family.name in r.get("values", {})]  # fmt: skip
        if not values:  # never recorded (a loss before the first log step): left out
            return None
        value = {"newest": values[-1], "max": max(values), "sum": sum(values)}[family.merge]
        kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
        return kind(family.name, family.doc, value=value)

    def _histogram(self, family: Family, records: list[Record]) -> Metric | None:
        """The sum of every file's observations, per rank (metrics.per_rank) or per pod; left
        out until something was observed."""
        by_rank = self.per_rank and family is STEP_SECONDS
        totals: dict[str, tuple[list[int], float]] = {}
        for r in records:
            found = r.get("histograms", {}).get(family.name)
            if not found or len(found["counts"]) != len(family.buckets) + 1:
                continue
            key = str(r["rank"]) if by_rank else ""
            counts, total = totals.get(key, ([0] * len(found["counts"]), 0.0))
            counts = [a + b for a, b in zip(counts, found["counts"], strict=True)]
            totals[key] = (counts, total + float(found["sum"]))
        out = HistogramMetricFamily(family.name, family.doc, labels=["rank"] if by_rank else [])
        for key, (counts, total) in sorted(totals.items(), key=lambda kv: _rank_order(kv[0])):
            if not any(counts):
                continue
            bounds = [*(_le(b) for b in family.buckets), "+Inf"]
            cumulative, running = [], 0
            for le, count in zip(bounds, counts, strict=True):
                running += count
                cumulative.append((le, running))
            out.add_metric([key] if by_rank else [], cumulative, total)
        return out if out.samples else None


def _le(bound: float) -> str:
    """A bucket bound as prometheus_client writes it (`0.005`, `1.0`)."""
    return repr(float(bound))


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (-1, rank)


def _newest_per_rank(records: list[Record]) -> dict[str, Record]:
    newest: dict[str, Record] = {}
    for r in records:  # oldest first: a newer file of a rank replaces the older one
        newest[str(r["rank"])] = r
    return dict(sorted(newest.items(), key=lambda kv: _rank_order(kv[0])))


def _info(family: Family, names: list[str], label_sets: list[dict[str, Any]]) -> Metric | None:
    out = GaugeMetricFamily(family.name, family.doc, labels=names)
    for labels in label_sets:
        out.add_metric([str(labels.get(name, "")) for name in names], 1.0)
    return out if out.samples else None


class UserMetricsCollector:
    """prometheus_client's MultiProcessCollector over a user's program's own files: one file
    being created or cut short by a killed writer skips them for that scrape only (kubeddp's
    own series are served all the same)."""

    def __init__(self, directory: str) -> None:
        self.inner = MultiProcessCollector(None, path=directory)

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self.inner.collect())
        except (OSError, ValueError, struct.error):
            return  # read again at the next scrape, once its writer has written it
        yield from families
