"""docs/python-api.md's cells, run in order as a notebook runs them, against the fake API server
(tests/helpers/fake_api.py) answering as a cluster with the job would: the walk-through stays
true."""

from __future__ import annotations

import re

import pytest

from tests.helpers import fake_api
from tests.helpers.readme import DOCS

pytestmark = pytest.mark.timeout(120)
PAGE = DOCS / "python-api.md"
NS = fake_api.NAMESPACE
JOB = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
CREATED = ("configmaps", "persistentvolumeclaims", "services", "secrets")


def cells() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)


def a_cluster_with_the_job(api: fake_api.FakeApiServer) -> None:
    def echo() -> object:
        return api.calls("POST")[-1]["body"]

    for plural in CREATED:
        api.route("POST", f"/api/v1/namespaces/{NS}/{plural}", 201, echo)
    api.route("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", 201, echo)
    api.route("POST", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies", 201, echo)
    api.route("POST", JOB, 201, echo)
    done = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "demo"}}
    api.route("GET", f"{JOB}/demo", 200, {**job, "status": done})
    pods = [{"metadata": {"name": f"demo-worker-{i}", "uid": str(i)},
             "status": {"phase": "Succeeded"}} for i in range(2)]  # fmt: skip
    api.route("GET", PODS, 200, {"kind": "PodList", "apiVersion": "v1", "items": pods})
    for i in range(2):
        api.route("GET", f"{PODS}/demo-worker-{i}/log", 200, f"step 3/3 | worker {i}\n")
    api.route("DELETE", f"{JOB}/demo", 200, {"kind": "Status", "apiVersion": "v1",
                                             "status": "Success"})  # fmt: skip


def test_the_cells_run_in_order(tmp_path, monkeypatch, capsys) -> None:
    found = cells()
    assert len(found) >= 6, "docs/python-api.md lost its cells"
    with fake_api.running() as api:
        a_cluster_with_the_job(api)
        monkeypatch.setenv("KUBECONFIG", str(fake_api.write_kubeconfig(tmp_path / "kc", api.url)))
        namespace: dict = {}
        for index, cell in enumerate(found):
            exec(compile(cell, f"{PAGE.name} cell {index + 1}", "exec"), namespace)  # noqa: S102
        out = capsys.readouterr().out
    assert "pytorchjob/demo created in team" in out
    assert "PyTorchJob team/demo: Succeeded" in out
    assert "[demo-worker-1] step 3/3 | worker 1" in out
    assert "Succeeded True" in out
    assert "3 no job named 'no-such-job' in namespace 'team'" in out
    assert "pytorchjob/demo deleted" in out
    posted = [r["body"]["kind"] for r in api.calls("POST")]
    # the job first, then what it owns (tools/cluster/submit_order.py)
    assert posted[0] == "PyTorchJob"
    assert sorted(posted[1:]) == sorted(["ConfigMap", "PersistentVolumeClaim", "Secret", "Service",
                                         "Deployment", "NetworkPolicy"])  # fmt: skip
