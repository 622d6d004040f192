"""Contract tests of the cluster commands: a stdlib HTTP server on 127.0.0.1
(tests/helpers/fake_api.py) answers the Kubernetes REST paths the official client calls. They
check the request shape (method, path, query, body, token) and the one-line errors (CRD
missing, forbidden, no kubeconfig). They do not prove behaviour against a real API server (the
kind CI job does that)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kubeddp.trainer.exit_codes import CLUSTER_ERROR
from tests.helpers import reference
from tests.helpers.cluster_commands import (
    CLAIMS,
    CONFIGMAPS,
    CRD_PATH,
    CRDS,
    DEPLOYMENTS,
    KEEPER_JOB_COMPANIONS,
    NETWORK_POLICIES,
    NS,
    PODS,
    PODS_LIST,
    PYTORCHJOB_KEY,
    PYTORCHJOB_STATUS,
    PYTORCHJOBS,
    RUNTIMES,
    SECRETS,
    SERVICES,
    STORAGE_CLASSES,
    TRAINJOBS,
    run,
)
from tests.helpers.fake_api import TOKEN, status_body

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def test_submit_server_dry_run_posts_each_object_with_dry_run_all(api, capsys):
    for path in (PYTORCHJOBS, *KEEPER_JOB_COMPANIONS):
        api.route("POST", path, 201, lambda: api.calls("POST")[-1]["body"])
    code, out, err = run(
        [
            "submit",
            "pytorchjob",
            "--name",
            "demo",
            "--nodes",
            "2",
            "--dry-run",
            "server",
            "--validate-against",
            "offline",
        ],
        capsys,
    )
    assert code == 0, err
    posts = api.calls("POST")
    # the job first, then what it owns (here no uid comes back: nothing is owned)
    assert [p["path"] for p in posts] == [PYTORCHJOBS, *KEEPER_JOB_COMPANIONS]
    assert all(p["query"] == {"dryRun": "All"} for p in posts)
    assert all(p["authorization"] == f"Bearer {TOKEN}" for p in api.requests)
    assert posts[0]["body"]["kind"] == "PyTorchJob"
    assert posts[0]["body"]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert not any("ownerReferences" in p["body"]["metadata"] for p in posts)
    assert "pytorchjob/demo created in team (server dry run)" in out


def test_submit_without_dry_run_sends_no_dry_run_query(api, capsys):
    api.route("POST", CONFIGMAPS, 201)
    api.route("POST", CLAIMS, 201)
    api.route("POST", RUNTIMES, 201)
    api.route("POST", TRAINJOBS, 201)
    code, _, err = run(
        ["submit", "trainjob", "--name", "demo", "--validate-against", "offline"], capsys
    )
    assert code == 0, err
    posts = api.calls("POST")
    assert [p["query"] for p in posts] == [{}, {}, {}, {}]
    # the job's own TrainingRuntime exists before the TrainJob that refers to it
    assert [p["path"] for p in posts] == [RUNTIMES, TRAINJOBS, CONFIGMAPS, CLAIMS]


def test_status_shows_each_pods_termination_message(api, capsys):
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    ended = {"terminated": {"exitCode": 5, "message": "retries exhausted: 6 restarts of pod x"}}
    last = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    pods = {
        "kind": "PodList",
        "apiVersion": "v1",
        "items": [
            {"metadata": {"name": "demo-worker-0"},
             "status": {"phase": "Failed", "containerStatuses": [{"state": ended}]}},
            {"metadata": {"name": "demo-worker-1"},
             "status": {"phase": "Running", "containerStatuses": [
                 {"state": {"running": {}}, "lastState": last, "restartCount": 1}]}},
        ]
    }  # fmt: skip
    api.route("GET", PODS, 200, pods)
    code, out, err = run(["status", "demo"], capsys)
    assert code == 0, err
    assert "    ended exit 5: retries exhausted: 6 restarts of pod x" in out, out
    assert "    last ended exit 137: OOMKilled" in out, out


def test_validation_reads_the_crd_from_the_cluster(api, capsys):
    text = reference.read_text(CRDS / "kubeflow.org_pytorchjobs.v1.9.4.yaml")
    crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    api.route("GET", CRD_PATH + "pytorchjobs.kubeflow.org", 200, crd)
    code, out, err = run(["render", "pytorchjob", "--validate-against", "cluster"], capsys)
    assert code == 0, err
    assert "kind: PyTorchJob" in out
    assert [r["path"] for r in api.requests] == [CRD_PATH + "pytorchjobs.kubeflow.org"]


def test_missing_crd_for_validation_is_named_with_install_command(api, capsys):
    api.route(
        "GET",
        CRD_PATH + "trainjobs.trainer.kubeflow.org",
        404,
        status_body(404, "NotFound", "not found", {"name": "trainjobs.trainer.kubeflow.org"}),
    )
    code, _, err = run(["render", "trainjob", "--validate-against", "cluster"], capsys)
    assert code == CLUSTER_ERROR
    assert "trainjobs.trainer.kubeflow.org is not installed" in err
    assert "manifests/overlays/manager?ref=v2.3.0" in err


def test_missing_pytorchjob_crd_on_submit_says_install_training_operator(api, capsys):
    api.route("POST", CONFIGMAPS, 201)  # PyTorchJobs: the default plain "404 page not found"
    api.route("POST", CLAIMS, 201)
    code, _, err = run(["submit", "pytorchjob", "--validate-against", "offline"], capsys)
    assert code == CLUSTER_ERROR
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "install the Kubeflow training operator" in line
    assert "kubectl apply --server-side -k" in line and "ref=v1.9.4" in line


def test_missing_trainjob_crd_on_submit_says_install_trainer(api, capsys):
    api.route("POST", CONFIGMAPS, 201)
    api.route("POST", CLAIMS, 201)
    code, _, err = run(["submit", "trainjob", "--validate-against", "offline"], capsys)
    assert code == CLUSTER_ERROR
    assert "Kubeflow Trainer v2.3.0" in err and "overlays/runtimes?ref=v2.3.0" in err


def test_forbidden_names_verb_resource_and_rbac_file(api, capsys):
    api.route("POST", PYTORCHJOBS, 201)  # the job first: then its ConfigMap is refused
    api.route(
        "POST",
        CONFIGMAPS,
        403,
        status_body(
            403,
            "Forbidden",
            'configmaps is forbidden: User "bob" cannot create resource',
            {"kind": "configmaps"},
        ),
    )
    code, _, err = run(["submit", "pytorchjob", "--validate-against", "offline"], capsys)
    assert code == CLUSTER_ERROR
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "forbidden: cannot create configmaps in namespace 'team'" in line
    assert "k8s/rbac.yaml" in line


def test_already_exists_says_delete_first(api, capsys):
    api.route("POST", PYTORCHJOBS, 201)
    api.route(
        "POST",
        CONFIGMAPS,
        409,
        status_body(409, "AlreadyExists", "exists", {"name": "kubeddp-config"}),
    )
    code, _, err = run(["submit", "pytorchjob", "--validate-against", "offline"], capsys)
    assert code == CLUSTER_ERROR and "already exists" in err and "kubeddp delete" in err


def test_a_companion_left_by_an_earlier_job_is_refused_before_the_job_is_made(api, capsys):
    """A ConfigMap an earlier job of this name left behind (nothing owned it): the new job must
    not start with it, so nothing is created."""
    api.route("GET", f"{CONFIGMAPS}/kubeddp-config", 200, {"kind": "ConfigMap", "apiVersion": "v1",
              "metadata": {"name": "kubeddp-config"}})  # fmt: skip
    api.route("POST", PYTORCHJOBS, 201)
    code, _, err = run(["submit", "pytorchjob", "--validate-against", "offline"], capsys)
    assert code == CLUSTER_ERROR, err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "configmaps 'kubeddp-config' already exists in namespace 'team'" in line, line
    assert "kubeddp delete" in line and api.calls("POST") == []


def test_no_kubeconfig_is_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, err = run(["status", "demo"], capsys)
    assert code == CLUSTER_ERROR
    (line,) = err.strip().splitlines()
    assert "no Kubernetes credentials" in line and "--kubeconfig" in line


def test_explicit_kubeconfig_that_does_not_exist(tmp_path, capsys):
    code, _, err = run(["status", "demo", "--kubeconfig", str(tmp_path / "nope")], capsys)
    assert code == CLUSTER_ERROR and "no kubeconfig at" in err


def test_submit_file_uses_the_documents_namespace(api, tmp_path, capsys):
    api.route("POST", "/api/v1/namespaces/other/configmaps", 201)
    path = tmp_path / "cm.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "x", "namespace": "other"},
            }
        )
    )
    code, _, err = run(["submit", "-f", str(path), "--validate-against", "offline"], capsys)
    assert code == 0, err
    assert api.calls("POST")[0]["body"]["metadata"]["name"] == "x"


def test_submit_refuses_an_invalid_file_before_sending(api, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"n": 1}}
        )
    )
    code, _, err = run(["submit", "-f", str(path), "--validate-against", "offline"], capsys)
    assert code == 2 and "data.n" in err
    assert api.requests == []


def test_status_prints_conditions_replicas_and_restarts(api, capsys):
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    api.route("GET", PODS, 200, PODS_LIST)
    code, out, err = run(["status", "demo"], capsys)
    assert code == 0, err
    assert "PyTorchJob team/demo: Running" in out
    assert "Running=True PyTorchJobRunning" in out
    assert "Worker: active=1, failed=0" in out
    assert "demo-worker-0: Running, restarts=2, node=n2" in out
    pod_query = next(c["query"] for c in api.calls("GET") if c["path"] == PODS)
    assert pod_query == {"labelSelector": "training.kubeflow.org/job-name=demo"}
    # no log routes here: the health lines say so, status still works
    assert "health: unknown (log not readable" in out


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_status_as_json_or_yaml(api, capsys, output):
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    api.route("GET", PODS, 200, PODS_LIST)
    code, out, err = run(["status", "demo", "-o", output], capsys)
    assert code == 0, err
    report = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert (report["kind"], report["namespace"], report["name"]) == ("PyTorchJob", NS, "demo")
    assert report["state"] == "Running"
    assert {"type": "Running", "status": "True"}.items() <= report["conditions"][-1].items()
    assert "Worker: active=1, failed=0" in report["replicas"]
    pod = report["pods"][1]
    assert isinstance(pod.pop("health"), list)  # read from the pod's log (none routed here)
    assert pod.pop("metrics") == []  # and its /metrics (none routed either)
    assert pod == {
        "name": "demo-worker-0", "phase": "Running", "restarts": 2, "node": "n2", "ends": [],
    }  # fmt: skip


def test_status_of_a_missing_job(api, capsys):
    api.route(
        "GET",
        f"{PYTORCHJOBS}/nope",
        404,
        status_body(
            404,
            "NotFound",
            'pytorchjobs.kubeflow.org "nope" not found',
            {"name": "nope", "group": "kubeflow.org", "kind": "pytorchjobs"},
        ),
    )
    code, _, err = run(["status", "nope", "--kind", "pytorchjob"], capsys)
    assert code == CLUSTER_ERROR and "'nope' not found in namespace 'team'" in err
    code, _, err = run(["status", "nope"], capsys)  # no job of any kind by that name
    assert code == CLUSTER_ERROR, err
    assert "no job named 'nope' in namespace 'team' (looked for a PyTorchJob, TrainJob, Job)" in err


@pytest.mark.parametrize(("condition", "exit_code"), [("Succeeded", 0), ("Failed", 1)])
def test_wait_exit_codes(api, capsys, condition, exit_code):
    job = {
        **PYTORCHJOB_KEY,
        "status": {
            "conditions": [
                {"type": "Running", "status": "False"},
                {"type": condition, "status": "True"},
            ]
        },
    }
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, job)
    code, out, _ = run(["wait", "demo", "--timeout", "5", "--interval", "0.05"], capsys)
    assert code == exit_code and condition in out


def test_wait_times_out_with_124(api, capsys):
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    code, out, _ = run(["wait", "demo", "--timeout", "0.2", "--interval", "0.05"], capsys)
    assert code == 124 and "still running" in out
    assert len(api.calls("GET")) >= 2


def test_wait_for_trainjob_uses_complete_condition(api, capsys):
    api.route(
        "GET",
        f"{TRAINJOBS}/demo",
        200,
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "demo"},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]},
        },
    )
    code, _, _ = run(["wait", "demo", "--kind", "trainjob", "--timeout", "5"], capsys)
    assert code == 0


def test_logs_per_replica_with_container_and_prefix(api, capsys):
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    api.route("GET", PODS, 200, {**PODS_LIST, "items": PODS_LIST["items"][1:]})
    api.route("GET", f"{PODS}/demo-worker-0/log", 200, "step 1\nstep 2\n")
    code, out, err = run(["logs", "demo", "--replica", "Worker", "--tail", "50"], capsys)
    assert code == 0, err
    assert out.splitlines() == ["[demo-worker-0] step 1", "[demo-worker-0] step 2"]
    list_call, log_call = [c for c in api.calls("GET") if c["path"].startswith(PODS)]
    assert list_call["query"]["labelSelector"] == (
        "training.kubeflow.org/job-name=demo,training.kubeflow.org/replica-type=worker"
    )
    assert log_call["query"] == {"container": "pytorch", "tailLines": "50"}


def test_logs_follow_streams_every_pod(api, capsys):
    ended = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, {**PYTORCHJOB_KEY, "status": ended})
    api.route("GET", PODS, 200, PODS_LIST)
    for pod in ("demo-master-0", "demo-worker-0"):
        api.route("GET", f"{PODS}/{pod}/log", 200, f"hello from {pod}\n")
    code, out, err = run(["logs", "demo", "--follow"], capsys)
    assert code == 0, err
    assert sorted(out.splitlines()) == [
        "[demo-master-0] hello from demo-master-0",
        "[demo-worker-0] hello from demo-worker-0",
    ]
    logs = [c for c in api.calls("GET") if c["path"].endswith("/log")]
    assert len(logs) == 2 and all(c["query"].get("follow") == "true" for c in logs)


def test_logs_without_pods_says_so(api, capsys):
    other = PYTORCHJOBS.replace(f"/{NS}/", "/other/")
    api.route("GET", f"{other}/demo", 200, PYTORCHJOB_STATUS)
    api.route("GET", "/api/v1/namespaces/other/pods", 200, {**PODS_LIST, "items": []})
    code, _, err = run(["logs", "demo", "-n", "other"], capsys)
    assert code == CLUSTER_ERROR and "no pods" in err
    assert api.calls("GET")[-1]["path"] == "/api/v1/namespaces/other/pods"


def test_delete_removes_job_and_companions_and_ignores_missing(api, capsys):
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)  # its kind, found by name
    api.route(
        "DELETE",
        f"{PYTORCHJOBS}/demo",
        200,
        {"kind": "Status", "apiVersion": "v1", "status": "Success"},
    )
    api.route("DELETE", f"{CONFIGMAPS}/demo-config", 200)
    # The PodMonitor API is absent (default 404 page): not an error for delete.
    code, out, err = run(["delete", "demo"], capsys)
    assert code == 0, err
    deletes = api.calls("DELETE")
    assert [d["path"] for d in deletes] == [
        f"{PYTORCHJOBS}/demo",
        f"{CONFIGMAPS}/demo-config",
        f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors/demo",
        f"{DEPLOYMENTS}/demo-keeper",
        f"{SERVICES}/demo-keeper",
        f"{NETWORK_POLICIES}/demo-keeper",
        f"{SECRETS}/demo-keeper-token",
    ]
    assert deletes[0]["body"]["propagationPolicy"] == "Background"
    assert "pytorchjob/demo deleted" in out


def test_delete_removes_the_service_account_render_made_for_the_job(api, capsys):
    """--create-service-account may name the account anything; delete finds it by its labels."""
    accounts = f"/api/v1/namespaces/{NS}/serviceaccounts"
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    api.route(
        "DELETE",
        f"{PYTORCHJOBS}/demo",
        200,
        {"kind": "Status", "apiVersion": "v1", "status": "Success"},
    )
    api.route("GET", accounts, 200, {"kind": "ServiceAccountList", "apiVersion": "v1",
                                     "items": [{"metadata": {"name": "trainer-sa"}}]})  # fmt: skip
    api.route("DELETE", f"{accounts}/trainer-sa", 200)
    code, out, err = run(["delete", "demo"], capsys)
    assert code == 0, err
    (listed,) = [c for c in api.calls("GET") if c["path"] == accounts]
    assert listed["query"]["labelSelector"] == (
        "app.kubernetes.io/instance=demo,app.kubernetes.io/managed-by=kubeddp"
    )
    assert api.calls("DELETE")[-1]["path"] == f"{accounts}/trainer-sa"
    assert "serviceaccount/trainer-sa deleted" in out


def test_delete_forbidden_to_list_service_accounts_says_so(api, capsys):
    """A Role from before serviceaccounts were granted: the job is gone, the line says the fix."""
    accounts = f"/api/v1/namespaces/{NS}/serviceaccounts"
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    api.route(
        "DELETE",
        f"{PYTORCHJOBS}/demo",
        200,
        {"kind": "Status", "apiVersion": "v1", "status": "Success"},
    )
    api.route("GET", accounts, 403, status_body(403, "Forbidden", "no"))
    code, out, err = run(["delete", "demo"], capsys)
    assert "pytorchjob/demo deleted" in out
    assert code == CLUSTER_ERROR and "cannot list serviceaccounts" in err and "rbac" in err
    assert len(err.strip().splitlines()) == 1


def test_delete_forbidden(api, capsys):
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    api.route("DELETE", f"{PYTORCHJOBS}/demo", 403, status_body(403, "Forbidden", "no"))
    code, _, err = run(["delete", "demo"], capsys)
    assert (
        code == CLUSTER_ERROR and "cannot delete pytorchjobs.kubeflow.org" in err and "rbac" in err
    )


def test_auto_validation_falls_back_offline_when_crds_are_not_readable(api, capsys):
    api.route(
        "GET", CRD_PATH + "pytorchjobs.kubeflow.org", 403, status_body(403, "Forbidden", "no")
    )
    api.route("POST", CONFIGMAPS, 201)
    api.route("POST", CLAIMS, 201)
    api.route("POST", PYTORCHJOBS, 201)
    code, out, err = run(["submit", "pytorchjob", "--name", "demo"], capsys)
    assert code == 0, err
    assert "validating offline" in err and "customresourcedefinitions" in err
    # the CRD, the StorageClasses (absent here: a note), what the job will own (none there
    # yet), then the objects: the job first
    methods = [r["method"] for r in api.requests]
    assert methods == ["GET", "GET", "GET", "GET", "POST", "POST", "POST"], api.requests
    assert [r["path"] for r in api.calls("POST")] == [PYTORCHJOBS, CONFIGMAPS, CLAIMS]
    assert "StorageClasses not checked" in err


def storage_class_list(classes: list[dict]) -> dict:
    return {"kind": "StorageClassList", "apiVersion": "storage.k8s.io/v1", "items": classes}


def _storage_class(name: str, provisioner: str, default: bool = False) -> dict:
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"metadata": {"name": name, "annotations": annotations}, "provisioner": provisioner}


def test_submit_refuses_a_readwritemany_claim_on_a_readwriteonce_default_class(api, capsys):
    """EKS: gp3 (EBS) is the default class; a ReadWriteMany claim would stay Pending with every
    pod, so nothing is created and the line says what to do."""
    classes = [_storage_class("gp3", "ebs.csi.aws.com", default=True)]
    api.route("GET", STORAGE_CLASSES, 200, storage_class_list(classes))
    argv = ["submit", "pytorchjob", "--nodes", "3", "--checkpoint-storage", "mount",
            "--validate-against", "offline"]  # fmt: skip
    code, _, err = run(argv, capsys)
    assert code == 2, err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "asks for ReadWriteMany but the default StorageClass gp3 (ebs.csi.aws.com)" in line
    assert "Leave --checkpoint-storage and --checkpoint-access-mode unset" in line
    assert api.calls("POST") == []


def test_submit_names_the_storage_and_checks_the_default_class(api, capsys):
    classes = [
        _storage_class("standard", "rancher.io/local-path", default=True),
        _storage_class("fast", "example.com/unknown-driver"),
    ]
    api.route("GET", STORAGE_CLASSES, 200, storage_class_list(classes))
    for path in (PYTORCHJOBS, *KEEPER_JOB_COMPANIONS):
        api.route("POST", path, 201)
    code, _, err = run(["submit", "pytorchjob", "--nodes", "4", "--validate-against", "offline"],
                       capsys)  # fmt: skip
    assert code == 0, err
    assert "kubeddp submit: Checkpoints: claim kubeddp-checkpoints (ReadWriteOnce" in err
    assert "the default StorageClass standard (rancher.io/local-path) offers ReadWriteOnce" in err
    argv = ["submit", "pytorchjob", "--name", "b", "--storage-class", "fast",
            "--validate-against", "offline"]  # fmt: skip
    code, _, err = run(argv, capsys)
    assert code == 0, err
    assert "StorageClass fast (example.com/unknown-driver) is not one kubeddp knows" in err
    code, _, err = run(["submit", "pytorchjob", "--name", "c", "--storage-class", "nope",
                        "--validate-against", "offline"], capsys)  # fmt: skip
    assert code == 2 and "names StorageClass nope, which the cluster does not have" in err
