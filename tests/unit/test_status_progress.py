"""`kubeddp status` finds the job's kind by its name and shows the job's progress: step,
percent, ETA and loss read from the pods' /metrics through the API server's pod proxy (the
exposition a real worker's metrics make), says in one line which pods it could not read and
why, and shows a TrainJob's status.trainerStatus. Against the fake API server, through both
transports."""

from __future__ import annotations

import json

import pytest

from kubeddp.client import KubeddpError
from kubeddp.tools.cli.main import main
from kubeddp.tools.cluster import pod_metrics
from kubeddp.trainer import exit_codes
from tests.helpers import fake_api
from tests.helpers.api_client import TRANSPORTS, fake_cluster
from tests.helpers.fake_api import status_body
from tests.helpers.metrics import exposition, on_step_call

pytestmark = pytest.mark.timeout(120)
NS = fake_api.NAMESPACE
PYTORCHJOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
TRAINJOBS = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
# A worker 30 steps into a run planned for 120, every step 0.25 s: 90 left, 22.5 s.
RANK0_AT_STEP_30 = f"""
from kubeddp.trainer.config import MetricsConfig
from kubeddp.trainer.worker.metrics import TrainingMetrics
m = TrainingMetrics(MetricsConfig(), 0, 2, "gloo")
m.on_plan(120)
for step in range(1, 31):
    {on_step_call(loss="0.5 if step == 30 else None", step="step", samples=4, step_seconds=0.25)}
m.close()
"""


def running_pod(name: str, metrics_port: int | None = None) -> dict:
    ports = [{"name": "metrics", "containerPort": metrics_port}] if metrics_port else []
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": "n1", "containers": [{"name": "pytorch", "ports": ports}]},
        "status": {"phase": "Running", "containerStatuses": [{"restartCount": 0}]},
    }


def pytorchjob(name: str = "demo") -> dict:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Running", "status": "True"}]}}  # fmt: skip


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_status_shows_progress_and_eta_from_the_pods_metrics(transport, tmp_path, monkeypatch):
    text = exposition(tmp_path / "metrics", RANK0_AT_STEP_30)
    with fake_cluster(transport, tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{PYTORCHJOBS}/demo", 200, pytorchjob())
        pods = [running_pod("demo-worker-0", metrics_port=9100), running_pod("demo-worker-1")]
        api.route("GET", PODS, 200, {"kind": "PodList", "apiVersion": "v1", "items": pods})
        api.route("GET", f"{PODS}/demo-worker-0:9100/proxy/metrics", 200, text)
        forbidden = status_body(403, "Forbidden", 'pods "demo-worker-1" is forbidden')
        api.route("GET", f"{PODS}/demo-worker-1:8479/proxy/metrics", 403, forbidden)
        report = client.status("demo")
    lines = str(report).splitlines()
    assert lines[0] == "PyTorchJob team/demo: Running"
    assert lines[1] == (
        "progress: step 30/120 (25%), eta 0:00:22, loss 0.5000 (/metrics of demo-worker-0)"
    )
    assert lines[2].startswith(
        "progress: /metrics not read from demo-worker-1: forbidden: cannot get pods/proxy "
        "in namespace 'team'; ask an admin to apply k8s/rbac.yaml"
    ), lines[2]
    worker0 = str(report).split("demo-worker-0:", 1)[1]
    assert "    metrics: step 30/120 (25%), eta 0:00:22, loss 0.5000" in worker0
    assert report["progress"] == {
        "step": 30, "planned_steps": 120, "percent": 25.0, "eta_seconds": 22, "loss": 0.5,
        "pod": "demo-worker-0",
    }  # fmt: skip
    assert json.loads(json.dumps(report)) == dict(report)  # -o json prints it as it is


def test_the_cli_prints_what_the_api_returns(tmp_path, monkeypatch, capsys):
    text = exposition(tmp_path / "metrics", RANK0_AT_STEP_30)
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{PYTORCHJOBS}/demo", 200, pytorchjob())
        pods = {"kind": "PodList", "apiVersion": "v1", "items": [running_pod("demo-worker-0")]}
        api.route("GET", PODS, 200, pods)
        api.route("GET", f"{PODS}/demo-worker-0:8479/proxy/metrics", 200, text)
        capsys.readouterr()
        code = main(["status", "demo", "--kubeconfig", client.kubeconfig])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out == f"{client.status('demo')}\n"


def test_a_trainjob_is_found_by_its_name_and_shows_its_trainer_status(tmp_path, monkeypatch):
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "tj"},
        "status": {
            "conditions": [{"type": "Complete", "status": "True"}],
            "trainerStatus": {
                "progressPercentage": 25, "estimatedRemainingSeconds": 90,
                "metrics": [{"name": "loss", "value": "0.5"},
                            {"name": "eval_loss", "value": "0.6"}],
                "lastUpdatedTime": "2026-01-01T00:00:00Z",
            },
        },
    }  # fmt: skip
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{TRAINJOBS}/tj", 200, trainjob)
        api.route("GET", PODS, 200, {"kind": "PodList", "apiVersion": "v1", "items": []})
        report = client.status("tj")
        end = client.wait("tj", timeout="1s")
    assert str(report).splitlines()[:2] == [
        "TrainJob team/tj: Succeeded",
        "trainer status: 25%, eta 0:01:30, loss 0.5, eval_loss 0.6 (updated 2026-01-01T00:00:00Z)",
    ]
    assert str(end) == "TrainJob team/tj: Succeeded" and end.succeeded
    pods_query = [r["query"] for r in api.requests if r["path"] == PODS]
    assert pods_query == [{"labelSelector": "jobset.sigs.k8s.io/jobset-name=tj"}]


def test_two_kinds_of_one_name_is_one_line_naming_both(tmp_path, monkeypatch, capsys):
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{PYTORCHJOBS}/demo", 200, pytorchjob())
        api.route("GET", f"{TRAINJOBS}/demo", 200, {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "demo"}})  # fmt: skip
        with pytest.raises(KubeddpError) as err:
            client.delete("demo")
        assert api.calls("DELETE") == []
        code = main(["delete", "demo", "--kubeconfig", client.kubeconfig])
        _, stderr = capsys.readouterr()
    assert err.value.exit_code == code == exit_codes.BAD_INPUT
    assert str(err.value) == (
        "'demo' names a PyTorchJob and a TrainJob in namespace 'team'; "
        "pass --kind pytorchjob or --kind trainjob"
    )
    assert stderr.splitlines() == err.value.cli_lines()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ((404, "404 page not found"), "nothing serves /metrics on port 8479"),
        ((503, status_body(503, "ServiceUnavailable", "error trying to reach service: dial tcp "
                           "10.0.0.5:8479: connect: connection refused")),
         "the API server's pod proxy cannot reach port 8479"),
        ((200, "<html>not prometheus</html>\n"), "port 8479 answers no Prometheus metrics"),
    ],
    ids=["not-served", "unreachable", "not-metrics"],
)  # fmt: skip
def test_why_metrics_were_not_read_is_one_line(tmp_path, monkeypatch, answer, why):
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{PYTORCHJOBS}/demo", 200, pytorchjob())
        pods = {"kind": "PodList", "apiVersion": "v1", "items": [running_pod("demo-worker-0")]}
        api.route("GET", PODS, 200, pods)
        api.route("GET", f"{PODS}/demo-worker-0:8479/proxy/metrics", *answer)
        report = client.status("demo")
    progress = [line for line in str(report).splitlines() if line.startswith("progress:")]
    assert len(progress) == 1, progress
    assert progress[0].startswith(f"progress: /metrics not read from demo-worker-0: {why}")
    assert report["progress"] is None


def test_a_script_without_a_planned_total_shows_its_step(tmp_path) -> None:
    """A user script's report_step: the step and loss, no percent or ETA to make up."""
    text = exposition(tmp_path, f"""
        from kubeddp.trainer.config import MetricsConfig
        from kubeddp.trainer.worker.metrics import TrainingMetrics
        m = TrainingMetrics(MetricsConfig(), 0, 1, "gloo")
        {on_step_call(step=7, epoch=None, loss=1.25, lr=None, samples=1, step_seconds=None)}
        m.close()
    """)  # fmt: skip
    found = pod_metrics.progress(pod_metrics.parse("p", text))
    assert found is not None
    assert pod_metrics.progress_text(found) == "step 7, loss 1.2500"


def test_no_running_pod_says_so(tmp_path, monkeypatch) -> None:
    pending = {**running_pod("demo-worker-0"), "status": {"phase": "Pending"}}
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{PYTORCHJOBS}/demo", 200, pytorchjob())
        api.route("GET", PODS, 200, {"kind": "PodList", "apiVersion": "v1", "items": [pending]})
        report = client.status("demo")
    assert "progress: no running pod to read /metrics from" in str(report).splitlines()
    assert not [r for r in api.requests if r["path"].endswith("/proxy/metrics")]


def test_each_pod_shows_the_age_of_its_snapshot_in_memory() -> None:
    """The gauges TrainingMetrics.on_snapshot sets on the pod of a snapshot writer."""
    samples = (
        ("kubeddp_snapshot_last_timestamp_seconds", {}, 1000.0),
        ("kubeddp_snapshot_step", {}, 160.0),
        ("kubeddp_snapshot_size_bytes", {}, 5.5 * 2**20),
        ("kubeddp_snapshot_interval_steps", {}, 6.0),
    )
    line = pod_metrics._pod_snapshot_line(pod_metrics.PodMetrics("p", samples), lambda: 1012.4)
    assert line == "snapshot in memory: step 160, 5.5 MiB, 0:00:12 old, every 6 steps"
    assert pod_metrics._pod_snapshot_line(pod_metrics.PodMetrics("p", ())) is None
