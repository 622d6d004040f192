"""The network check's results on the pod's /metrics: read at scrape time from the file rank 0
wrote into the metrics directory (worker/network.py), so a later check (a restarted worker
group) replaces every series of the earlier one, and a link that is no longer slow stops
showing as slow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubeddp.trainer.process_contract import NETWORK_CHECK_FILE

PAIR_LABELS = ["pod_a", "node_a", "pod_b", "node_b"]


class NetworkCheckCollector:
    """A prometheus_client custom collector over `<metrics dir>/network-check.json`."""

    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / NETWORK_CHECK_FILE

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return  # no check on this pod (not rank 0's, or none ran yet)
        duration = GaugeMetricFamily(
            "kubeddp_network_check_duration_seconds", "Time the latest network check took"
        )
        duration.add_metric([], float(data.get("seconds", 0.0)))
        bus = GaugeMetricFamily(
            "kubeddp_network_bus_bandwidth_bytes_per_second",
            "All-reduce bus bandwidth of the whole job at one message size (nccl-tests' busbw)",
            labels=["message_bytes"],
        )
        for size, value in sorted(data.get("bus", {}).items(), key=lambda kv: int(kv[0])):
            bus.add_metric([size], float(value))
        median = GaugeMetricFamily(
            "kubeddp_network_link_median_bandwidth_bytes_per_second",
            "Median bandwidth of the node pairs' links (one direction, both sending)",
        )
        median.add_metric([], float(data.get("median", 0.0)))
        yield from (duration, bus, median)
        slowest = data.get("slowest")
        if not slowest:
            return
        pair = [
            str(slowest["a"]["pod"]), str(slowest["a"]["node"]),
            str(slowest["b"]["pod"]), str(slowest["b"]["node"]),
        ]  # fmt: skip
        low = GaugeMetricFamily(
            "kubeddp_network_slowest_link_bandwidth_bytes_per_second",
            "Bandwidth of the slowest node pair's link, and which pods and nodes it joins",
            labels=PAIR_LABELS,
        )
        low.add_metric(pair, float(slowest.get("bps", 0.0)))
        yield low
        ratio = float(data.get("slow_ratio", 0.0))
        if ratio <= 0:  # not slow: no series (a later check that finds it fine removes it)
            return
        slow = GaugeMetricFamily(
            "kubeddp_network_slow_link_ratio",
            "How many times the slowest link is below the median; only while that is over "
            "network.slow_factor",
            labels=PAIR_LABELS,
        )
        slow.add_metric(pair, ratio)
        yield slow
