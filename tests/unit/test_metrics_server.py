"""The launch-side /metrics endpoint: bind/port resolution, errors, serving a directory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import prometheus_client  # noqa: F401 - imported before any test sets PROMETHEUS_MULTIPROC_DIR
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeddp.trainer import constants, process_contract
from kubeddp.trainer.config import MetricsConfig
from kubeddp.trainer.launcher.metrics_server import (
    MetricsPortBusy,
    MetricsSetupError,
    resolve_bind,
    resolve_linger,
    resolve_port,
    start_for_launch,
    start_pod_metrics,
)
from tests.helpers.metrics import on_step_call


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        constants.ENV_METRICS_PORT,
        constants.ENV_METRICS_BIND,
        constants.ENV_METRICS_LINGER,
        process_contract.ENV_PROMETHEUS_MULTIPROC_DIR,
    ):
        monkeypatch.delenv(name, raising=False)


def test_bind_is_loopback_outside_kubernetes_and_all_interfaces_in_a_pod() -> None:
    cfg = MetricsConfig()
    assert resolve_bind(cfg, in_kubernetes=False, env={}) == "127.0.0.1"
    assert resolve_bind(cfg, in_kubernetes=True, env={}) == "0.0.0.0"
    assert resolve_bind(MetricsConfig(bind="::1"), in_kubernetes=True, env={}) == "::1"
    env = {constants.ENV_METRICS_BIND: "0.0.0.0"}
    assert resolve_bind(cfg, in_kubernetes=False, env=env) == "0.0.0.0"


def test_port_comes_from_config_then_env() -> None:
    assert resolve_port(MetricsConfig(), {}) == constants.METRICS_PORT
    assert resolve_port(MetricsConfig(port=0), {}) == 0
    assert resolve_port(MetricsConfig(), {constants.ENV_METRICS_PORT: "9500"}) == 9500


@pytest.mark.parametrize(
    ("cfg", "env", "named"),
    [
        (MetricsConfig(port=70000), {}, "metrics.port=70000"),
        (MetricsConfig(), {constants.ENV_METRICS_PORT: "http"}, "KUBEDDP_METRICS_PORT='http'"),
    ],
)
def test_bad_port_names_the_value_and_the_fix(cfg, env, named) -> None:
    with pytest.raises(MetricsSetupError, match="0 = pick a free port") as err:
        resolve_port(cfg, env)
    assert named in str(err.value)


def test_bad_linger_and_pushgateway_are_rejected() -> None:
    with pytest.raises(MetricsSetupError, match="KUBEDDP_METRICS_LINGER_SECONDS='soon'"):
        resolve_linger({constants.ENV_METRICS_LINGER: "soon"})
    with pytest.raises(MetricsSetupError, match="metrics.pushgateway='gateway' must be host:port"):
        start_pod_metrics(MetricsConfig(port=0, pushgateway="gateway"), in_kubernetes=False)


def test_serves_the_directory_the_workers_write(tmp_path: Path) -> None:
    """kubeddp's own worker files and a program's own prometheus_client files, merged."""
    endpoint = start_pod_metrics(MetricsConfig(port=0), in_kubernetes=False)
    assert endpoint is not None
    try:
        directory = os.environ[process_contract.ENV_PROMETHEUS_MULTIPROC_DIR]
        assert directory == endpoint.directory and Path(directory).is_dir()
        assert endpoint.url == f"http://127.0.0.1:{endpoint.port}/metrics"
        code = (
            "from kubeddp.trainer.config import MetricsConfig\n"
            "from kubeddp.trainer.worker.metrics import TrainingMetrics\n"
            "m = TrainingMetrics(MetricsConfig(), 0, 1, 'gloo')\n"
            f"{on_step_call(step=7, loss=0.5, samples=4, step_seconds=0.01)}\n"
            "m.close()\n"
            # the program's own prometheus_client metric (docs/your-own-script.md)
            "from prometheus_client import Counter\n"
            "Counter('my_batches', 'a program of its own', registry=None).inc(3)\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        with urllib.request.urlopen(endpoint.url, timeout=5) as resp:
            families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
        assert families["kubeddp_step"].samples[0].value == 7
        assert families["kubeddp_samples"].samples[0].value == 4
        assert families["my_batches"].samples[0].value == 3
    finally:
        endpoint.close(0, log=print)
    assert not Path(endpoint.directory).exists()
    assert process_contract.ENV_PROMETHEUS_MULTIPROC_DIR not in os.environ


def test_busy_port_warns_and_training_goes_on(monkeypatch, capsys) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(MetricsPortBusy, match=f"127.0.0.1:{port}"):
            start_pod_metrics(MetricsConfig(port=port), in_kubernetes=False)
        monkeypatch.setenv(constants.ENV_METRICS_PORT, str(port))
        lines: list[str] = []
        assert start_for_launch(MetricsConfig(), in_kubernetes=False, log=lines.append) is None
    assert len(lines) == 1 and "metrics off" in lines[0] and str(port) in lines[0]
    assert process_contract.ENV_PROMETHEUS_MULTIPROC_DIR not in os.environ


def test_disabled_metrics_start_nothing() -> None:
    lines: list[str] = []
    assert start_for_launch(MetricsConfig(enabled=False), False, lines.append) is None
    assert lines == [] and process_contract.ENV_PROMETHEUS_MULTIPROC_DIR not in os.environ


def test_launch_prints_the_url(monkeypatch) -> None:
    monkeypatch.setenv(constants.ENV_METRICS_PORT, "0")
    lines: list[str] = []
    endpoint = start_for_launch(MetricsConfig(), in_kubernetes=False, log=lines.append)
    assert endpoint is not None
    try:
        assert lines == [f"[kubeddp] metrics: http://127.0.0.1:{endpoint.port}/metrics"]
    finally:
        endpoint.close(0, log=lines.append)
