"""Contract test of the Pushgateway summary against a tiny recording HTTP server on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import prometheus_client  # noqa: F401 - imported before any test sets PROMETHEUS_MULTIPROC_DIR
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kubeddp.trainer import process_contract
from kubeddp.trainer.config import MetricsConfig
from kubeddp.trainer.launcher.metrics_server import start_pod_metrics
from kubeddp.trainer.launcher.pushgateway import push_summary
from tests.helpers.metrics import on_step_call


class Recorder(BaseHTTPRequestHandler):
    requests: list[tuple[str, str, str, bytes]] = []

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.requests.append((self.command, self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.end_headers()

    do_PUT = do_POST = _record

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list]]:
    Recorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", Recorder.requests
    finally:
        server.shutdown()
        server.server_close()


def families(body: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_push_summary_puts_pod_metrics_and_run_result(gateway) -> None:
    address, requests = gateway
    push_summary(CollectorRegistry(), address, "train-a", exit_code=143, instance="pod-0")
    assert len(requests) == 1
    method, path, content_type, body = requests[0]
    assert method == "PUT"  # replaces this pod's previous push instead of merging into it
    assert path == "/metrics/job/train-a/instance/pod-0"
    assert content_type.startswith("text/plain")
    pushed = families(body)
    assert pushed["kubeddp_run_exit_code"].samples[0].value == 143
    assert pushed["kubeddp_run_finished_timestamp_seconds"].samples[0].value > 1.7e9


def test_launch_pushes_the_final_metrics_once_on_close(gateway, monkeypatch) -> None:
    address, requests = gateway
    monkeypatch.delenv(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR, raising=False)
    cfg = MetricsConfig(port=0, pushgateway=address, push_job="nightly")
    endpoint = start_pod_metrics(cfg, in_kubernetes=False)
    assert endpoint is not None
    code = (
        "from kubeddp.trainer.config import MetricsConfig\n"
        "from kubeddp.trainer.worker.metrics import TrainingMetrics\n"
        "m = TrainingMetrics(MetricsConfig(), 0, 1, 'gloo')\n"
        f"{on_step_call(step=3, loss=0.5, samples=96, step_seconds=0.01)}\n"
        "m.close()\n"
    )
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=os.environ)
        assert requests == []  # nothing is pushed while training runs
    finally:
        lines: list[str] = []
        endpoint.close(0, log=lines.append)
    assert len(requests) == 1, lines
    method, path, _, body = requests[0]
    assert method == "PUT" and path.startswith("/metrics/job/nightly/instance/")
    pushed = families(body)
    assert pushed["kubeddp_samples"].samples[0].value == 96
    assert pushed["kubeddp_step"].samples[0].value == 3
    assert pushed["kubeddp_run_exit_code"].samples[0].value == 0
    assert lines == [f"[kubeddp] metrics summary pushed to {address}"]


def test_unreachable_gateway_only_warns(monkeypatch) -> None:
    monkeypatch.delenv(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR, raising=False)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        endpoint = start_pod_metrics(MetricsConfig(port=0, pushgateway=closed), False)
        assert endpoint is not None
        lines: list[str] = []
        endpoint.close(1, log=lines.append)
    assert len(lines) == 1 and lines[0].startswith(
        f"[kubeddp] warning: cannot push metrics to {closed}"
    )
