"""`kubeddp status` shows, under each pod, the transport NCCL chose and rank 0's network check:
what a worker records (kubeddp_info's transport labels, the check's results file) served by
launch's own /metrics endpoint, read through the fake API server's pod proxy."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import urllib.request

import pytest

from kubeddp.tools.cluster import pod_metrics
from kubeddp.trainer import process_contract
from kubeddp.trainer.config import MetricsConfig
from kubeddp.trainer.launcher.metrics_server import start_pod_metrics
from tests.helpers import fake_api
from tests.helpers.api_client import fake_cluster

pytestmark = pytest.mark.timeout(120)
NS = fake_api.NAMESPACE
PYTORCHJOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
# Rank 0 of 4 nodes over InfiniBand; the check found the link of nodes 1 and 2 slow.
WORKER = textwrap.dedent("""
    from kubeddp.trainer.config import MetricsConfig
    from kubeddp.trainer.worker.metrics import TrainingMetrics
    from kubeddp.trainer.worker.netcheck_plan import CheckResult, Link, Member, judge
    from kubeddp.trainer.worker.network import write_results
    transport = {"transport": "infiniband", "transport_interfaces": "mlx5_0,mlx5_1",
                 "intra_node_transport": "P2P"}
    TrainingMetrics(MetricsConfig(), 0, 32, "gloo", transport=transport).close()
    members = [Member(8 * i, i, 0, f"demo-worker-{i}", f"gpu-{i}") for i in range(4)]
    rates = {(0, 1): 40e9, (0, 2): 41e9, (0, 3): 40e9, (1, 2): 6e9, (1, 3): 39e9, (2, 3): 42e9}
    links = [Link(members[a], members[b], bw) for (a, b), bw in rates.items()]
    check = CheckResult(32, 4, 4.8, {1 << 20: 38.5e9, 64 << 20: 352.9e9}, judge(links, 1.5))
    write_results(check)
""")


def _served_metrics() -> str:
    """What launch's /metrics serves once a worker has recorded WORKER."""
    endpoint = start_pod_metrics(MetricsConfig(port=0), in_kubernetes=False)
    assert endpoint is not None
    try:
        subprocess.run([sys.executable, "-c", WORKER], check=True, timeout=60)
        with urllib.request.urlopen(endpoint.url, timeout=5) as resp:
            return resp.read().decode()
    finally:
        endpoint.close(0, log=print)


def _pod(name: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": "gpu-0", "containers": [{"name": "pytorch", "ports": []}]},
        "status": {"phase": "Running", "containerStatuses": [{"restartCount": 0}]},
    }


def test_status_shows_the_transport_and_the_slow_pair(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR, raising=False)
    text = _served_metrics()
    assert process_contract.ENV_PROMETHEUS_MULTIPROC_DIR not in os.environ
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "demo"},
           "status": {"conditions": [{"type": "Running", "status": "True"}]}}  # fmt: skip
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{PYTORCHJOBS}/demo", 200, job)
        pods = {"kind": "PodList", "apiVersion": "v1", "items": [_pod("demo-worker-0")]}
        api.route("GET", PODS, 200, pods)
        api.route("GET", f"{PODS}/demo-worker-0:8479/proxy/metrics", 200, text)
        report = client.status("demo")
    worker0 = str(report).split("demo-worker-0:", 1)[1]
    assert (
        "    network: transport infiniband (mlx5_0,mlx5_1), P2P inside the node; check: "
        "all-reduce bus bandwidth 352.90 GB/s at 64 MiB; slowest node pair demo-worker-1 "
        "(gpu-1) <-> demo-worker-2 (gpu-2) 6.00 GB/s, 6.7x below the median (slow link)"
    ) in worker0, worker0


def test_a_gloo_pod_without_a_check_has_no_network_line() -> None:
    plain = pod_metrics.parse("p", 'kubeddp_info{transport="",rank="1"} 1.0\n')
    assert pod_metrics._pod_network_line(plain) is None
