"""Push the pod's final metrics to a Prometheus Pushgateway (metrics.pushgateway, off by default).

A short job can end between two scrapes; the Pushgateway keeps its last values. Launch pushes
once, after torchrun returns, grouped by job and pod (instance) so pods do not overwrite each
other.
"""

from __future__ import annotations

import re
import socket
import time
from typing import Any

# Imported in functions: prometheus_client (about 100 modules), only when a run pushes its summary:
# `kubeddp train --help` imports this module.

PUSH_TIMEOUT_SECONDS = 10.0
_HOST_PORT = re.compile(r"^(https?://)?[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


class PushgatewayAddressError(ValueError):
    """metrics.pushgateway is not host:port."""


def check_gateway_address(address: str) -> None:
    if not _HOST_PORT.match(address):
        raise PushgatewayAddressError(
            f"metrics.pushgateway={address!r} must be host:port, "
            "e.g. pushgateway.monitoring:9091 (empty = no push)"
        )


class _RunSummary:
    """Two gauges only the push carries: how and when this pod's run ended."""

    def __init__(self, exit_code: int, finished: float) -> None:
        self.exit_code = exit_code
        self.finished = finished

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(
            "kubeddp_run_exit_code", "Exit code of kubeddp launch on this pod", self.exit_code
        )
        yield GaugeMetricFamily(
            "kubeddp_run_finished_timestamp_seconds",
            "Unix time the run ended on this pod",
            self.finished,
        )


def push_summary(
    pod_registry: Any,
    gateway: str,
    job: str,
    *,
    exit_code: int,
    instance: str | None = None,
    timeout: float = PUSH_TIMEOUT_SECONDS,
) -> None:
    """PUT the pod's metrics plus the run summary under {job, instance}; raises OSError."""
    from prometheus_client import CollectorRegistry, push_to_gateway

    registry = CollectorRegistry()
    registry.register(pod_registry)  # a registry is a collector of everything it holds
    registry.register(_RunSummary(exit_code, time.time()))
    grouping = {"instance": instance or socket.gethostname()}
    push_to_gateway(gateway, job=job, registry=registry, grouping_key=grouping, timeout=timeout)
