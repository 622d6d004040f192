"""The pod's /metrics endpoint, served by `kubeddp launch` for all of its local workers.

Launch outlives torchrun's worker restarts, so the endpoint (and Prometheus' view of the pod)
stays up while workers come and go. Launch makes a fresh PROMETHEUS_MULTIPROC_DIR, exports it
to the workers through the environment, and serves the merge of the workers' files there, live
or dead (worker_metrics.py), with a user's program's own prometheus_client metrics beside them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeddp.trainer import constants, process_contract
from kubeddp.trainer.config import MetricsConfig
from kubeddp.trainer.launcher import end_signals, scratch
from kubeddp.trainer.launcher.pushgateway import (
    PushgatewayAddressError,
    check_gateway_address,
    push_summary,
)


class MetricsSetupError(ValueError):
    """A metrics setting is wrong; the message names the value and the fix."""


class MetricsPortBusy(MetricsSetupError):
    """The port cannot be bound; training goes on without an endpoint."""


def resolve_bind(cfg: MetricsConfig, in_kubernetes: bool, env: Mapping[str, str]) -> str:
    bind = env.get(constants.ENV_METRICS_BIND) or cfg.bind
    if bind == "auto":
        # In a pod Prometheus scrapes the pod IP; elsewhere do not expose it on the network.
        return "0.0.0.0" if in_kubernetes else "127.0.0.1"
    return bind


def resolve_port(cfg: MetricsConfig, env: Mapping[str, str]) -> int:
    raw = env.get(constants.ENV_METRICS_PORT)
    name = constants.ENV_METRICS_PORT if raw else "metrics.port"
    try:
        port = int(raw) if raw else cfg.port
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        shown = raw if raw else cfg.port
        raise MetricsSetupError(
            f"{name}={shown!r} is not a port; use 0-65535 (0 = pick a free port)"
        )
    return port


def _url_host(bind: str) -> str:
    if bind in ("0.0.0.0", ""):
        return socket.gethostname()
    return f"[{bind}]" if ":" in bind else bind


@dataclass
class PodMetricsEndpoint:
    directory: str
    url: str
    port: int
    cfg: MetricsConfig
    linger_seconds: float
    registry: Any
    _server: Any

    def finish(self, exit_code: int, log: Callable[[str], None]) -> None:
        """Linger (so a scrape sees the final values), push the summary, stop serving."""
        if self.linger_seconds > 0:
            log(f"[kubeddp] metrics: serving {self.linger_seconds:g}s more ({self.url})")
            # SIGTERM/SIGINT during the linger end it (torchrun's handlers raise an Exception).
            with contextlib.suppress(Exception, KeyboardInterrupt):
                time.sleep(self.linger_seconds)
        # From here a signal is ignored: the shutdown below waits for the server's loop (up to
        # half a second), and a signal raised in it would be an internal error.
        end_signals.ignore()
        self.close(exit_code, log)

    def close(self, exit_code: int, log: Callable[[str], None]) -> None:
        if self.cfg.pushgateway:
            try:
                push_summary(
                    self.registry, self.cfg.pushgateway, self.cfg.push_job, exit_code=exit_code
                )
                log(f"[kubeddp] metrics summary pushed to {self.cfg.pushgateway}")
            except OSError as exc:
                log(f"[kubeddp] warning: cannot push metrics to {self.cfg.pushgateway}: {exc}")
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)
        os.environ.pop(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR, None)


def start_pod_metrics(
    cfg: MetricsConfig, in_kubernetes: bool, env: Mapping[str, str] | None = None
) -> PodMetricsEndpoint | None:
    """Serve /metrics for this pod's workers; None when metrics are off.

    Sets PROMETHEUS_MULTIPROC_DIR in os.environ, which torchrun passes on to the workers.
    """
    env = os.environ if env is None else env
    if not cfg.enabled:
        return None
    bind = resolve_bind(cfg, in_kubernetes, env)
    port = resolve_port(cfg, env)
    linger = resolve_linger(env)
    if cfg.pushgateway:
        try:
            check_gateway_address(cfg.pushgateway)
        except PushgatewayAddressError as exc:
            raise MetricsSetupError(str(exc)) from None
    from prometheus_client import CollectorRegistry, start_http_server

    from kubeddp.trainer.launcher.network_metrics import NetworkCheckCollector
    from kubeddp.trainer.launcher.worker_metrics import (
        UserMetricsCollector,
        WorkerMetricsCollector,
    )

    # Named for this launch; what a killed launch left is swept here.
    directory = str(scratch.owned_dir(constants.METRICS_DIR_PREFIX))
    registry = CollectorRegistry()
    registry.register(WorkerMetricsCollector(directory, cfg.per_rank))
    registry.register(UserMetricsCollector(directory))  # a user's program's own metrics
    registry.register(NetworkCheckCollector(directory))  # rank 0's latest network check
    try:
        server, _ = start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise MetricsPortBusy(
            f"cannot serve metrics on {bind}:{port} ({exc.strerror}); set metrics.port to a "
            f"free port, or 0 to pick one (or ${constants.ENV_METRICS_PORT})"
        ) from None
    port = server.server_address[1]
    os.environ[process_contract.ENV_PROMETHEUS_MULTIPROC_DIR] = directory
    url = f"http://{_url_host(bind)}:{port}/metrics"
    return PodMetricsEndpoint(directory, url, port, cfg, linger, registry, server)


def resolve_linger(env: Mapping[str, str]) -> float:
    raw = env.get(constants.ENV_METRICS_LINGER, "")
    try:
        seconds = float(raw) if raw else 0.0
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        raise MetricsSetupError(
            f"{constants.ENV_METRICS_LINGER}={raw!r} must be a number of seconds >= 0"
        )
    return seconds


def start_for_launch(
    cfg: MetricsConfig,
    in_kubernetes: bool,
    log: Callable[[str], None],
    shared_host: bool = False,
) -> PodMetricsEndpoint | None:
    """What launch calls. A busy port only warns (training matters more than its metrics);
    other bad values raise MetricsSetupError. `shared_host`: several nodes of one job may run
    on this host (bare metal, not a pod), where the second finding the port taken is expected:
    it serves on a free port instead, without a warning.
    """
    try:
        endpoint = start_pod_metrics(cfg, in_kubernetes)
    except MetricsPortBusy as exc:
        if not shared_host:
            log(f"[kubeddp] warning: metrics off: {exc}")
            return None
        taken = resolve_port(cfg, os.environ)
        endpoint = start_pod_metrics(
            cfg, in_kubernetes, {**os.environ, constants.ENV_METRICS_PORT: "0"}
        )
        if endpoint is not None:
            log(f"[kubeddp] metrics: {endpoint.url} (port {taken} is another node's here)")
        return endpoint
    if endpoint is not None:
        log(f"[kubeddp] metrics: {endpoint.url}")
    return endpoint
