"""kubeddp.client, the Python API, mirrors the command line one to one: the same options (as
Python keywords), the same checks, the same one-line errors with the same exit codes, through
the same transports; the CLI prints what the API returns. Against the fake API server
(tests/helpers/fake_api.py), through the kubernetes client and through kubectl proxy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubeddp.client import Client, KubeddpError, WaitTimeout
from kubeddp.trainer import exit_codes
from tests.helpers import cluster_commands, fake_api
from tests.helpers.api_client import TRANSPORTS, fake_cluster
from tests.helpers.fake_api import status_body
from tests.helpers.render import secret_values_masked

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
NS = fake_api.NAMESPACE
PYTORCHJOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
CLAIMS = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
PODS = f"/api/v1/namespaces/{NS}/pods"
JOB = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "demo"}}
SUCCESS = {"kind": "Status", "apiVersion": "v1", "status": "Success"}


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()  # what the API call printed before is not the command's
    return cluster_commands.run(argv, capsys)


def test_render_gives_what_the_cli_prints(capsys) -> None:
    manifests = Client(say=lambda line: None).render(
        "pytorchjob",
        name="demo",
        nodes=2,
        env={"A": "1"},
        set={"train.epochs": 3},
        ttl_seconds_after_finished="1h",
        validate_against="offline",
    )
    argv = ["render", "pytorchjob", "--name", "demo", "--nodes", "2", "--env", "A=1", "--set",
            "train.epochs=3", "--ttl-seconds-after-finished", "3600", "--validate-against",
            "offline"]  # fmt: skip
    code, out, err = cli(argv, capsys)
    assert code == 0, err
    printed = [d for d in yaml.safe_load_all(out) if d]
    # every render makes a new keeper secret; nothing else of two renders differs
    assert secret_values_masked(printed) == secret_values_masked(manifests.documents)
    job = next(d for d in manifests.documents if d["kind"] == "PyTorchJob")
    assert job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 3600


@pytest.mark.parametrize(
    ("options", "argv"),
    [
        ({"nodes": 0}, ["--nodes", "0"]),
        ({"name": "Not_A_Name"}, ["--name", "Not_A_Name"]),
        ({"set": {"train.nope": 1}}, ["--set", "train.nope=1"]),
        ({"resources": "[1, 2]"}, ["--resources", "[1, 2]"]),
    ],
    ids=["nodes", "name", "set", "resources"],
)
def test_bad_render_options_are_the_clis_errors(options, argv, capsys) -> None:
    with pytest.raises(KubeddpError) as err:
        Client(say=lambda line: None).render("pytorchjob", validate_against="offline", **options)
    code, out, stderr = cli(["render", "pytorchjob", *argv, "--validate-against", "offline"],
                            capsys)  # fmt: skip
    assert (err.value.exit_code, err.value.command) == (code, "render") == (2, "render")
    assert [line for line in stderr.splitlines() if ": error: " in line] == err.value.cli_lines()
    assert out == ""


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"gpus": 8}, "'gpus' is not a render option"),
        ({"nodes": "two"}, "--nodes: 'two' is neither N nor MIN:MAX"),
        ({"nodes": 2, "nnodes": 3}, "nodes and nnodes are one option"),
        ({"nnodes": True}, "nnodes (--nnodes): True is not text"),
        ({"master_replica": "yes"}, "(--master-replica): 'yes' is not True or False"),
        ({"ttl_seconds_after_finished": "1.5s"}, "is not a whole number of seconds"),
    ],
)  # fmt: skip
def test_options_python_cannot_misspell(options, says) -> None:
    with pytest.raises(KubeddpError) as err:
        Client().render("pytorchjob", validate_against="offline", **options)
    assert err.value.exit_code == exit_codes.BAD_INPUT and says in str(err.value)


def _missing(api: fake_api.FakeApiServer) -> None:
    details = {"name": "nope", "group": "kubeflow.org", "kind": "pytorchjobs"}
    body = status_body(404, "NotFound", 'pytorchjobs.kubeflow.org "nope" not found', details)
    api.route("GET", f"{PYTORCHJOBS}/nope", 404, body)


def _forbidden(api: fake_api.FakeApiServer) -> None:
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, JOB)
    api.route("DELETE", f"{PYTORCHJOBS}/demo", 403, status_body(403, "Forbidden", "no"))


def _exists(api: fake_api.FakeApiServer) -> None:
    """The claim is made between submit's look for it and its create (it looks first)."""
    api.route("POST", PYTORCHJOBS, 201)
    api.route("POST", CONFIGMAPS, 201)
    details = {"name": "demo-checkpoints", "kind": "persistentvolumeclaims"}
    api.route("POST", CLAIMS, 409, status_body(409, "AlreadyExists", "exists", details))


def _html(api: fake_api.FakeApiServer) -> None:
    api.misbehaviour = "html"


SUBMIT = {"kind": "pytorchjob", "name": "demo", "validate_against": "offline"}
SCENARIOS = {  # name: (routes, the API call, the same on the command line)
    "missing": (_missing, lambda c: c.status("nope", "pytorchjob"),
                ["status", "nope", "--kind", "pytorchjob"]),
    "forbidden": (_forbidden, lambda c: c.delete("demo"), ["delete", "demo"]),
    "exists": (_exists, lambda c: c.submit(**SUBMIT),
               ["submit", "pytorchjob", "--name", "demo", "--validate-against", "offline"]),
    "html": (_html, lambda c: c.wait("demo", timeout="5s"), ["wait", "demo", "--timeout", "5s"]),
    "bad-name": (lambda api: None, lambda c: c.logs("../x"), ["logs", "../x"]),
}  # fmt: skip


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_errors_are_the_clis_lines_and_exit_codes(
    scenario, transport, tmp_path, monkeypatch, capsys
) -> None:
    routes, call, argv = SCENARIOS[scenario]
    with fake_cluster(transport, tmp_path, monkeypatch) as (api, client):
        routes(api)
        with pytest.raises(KubeddpError) as err:
            call(client)
        api_requests = len(api.requests)
        code, out, stderr = cli([*argv, "--kubeconfig", client.kubeconfig], capsys)
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert [e.replace(api.url, "URL") for e in errors] == [
        e.replace(api.url, "URL") for e in err.value.cli_lines()
    ]
    assert code == err.value.exit_code != 0
    assert out.splitlines() == err.value.done  # what it did before failing, on stdout
    assert len(api.requests) == 2 * api_requests  # the CLI sent what the API sent


def test_submit_names_what_it_created_also_when_it_fails(tmp_path, monkeypatch) -> None:
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        _exists(api)
        with pytest.raises(KubeddpError) as err:
            client.submit(**SUBMIT)
    # the job first (what it owns follows, tools/cluster/submit_order.py), then the ConfigMap
    assert err.value.done == [
        "pytorchjob/demo created in team",
        "configmap/demo-config created in team",
    ]
    assert err.value.exit_code == exit_codes.CLUSTER_ERROR
    assert "already exists in namespace 'team'" in str(err.value)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_job_from_submit_to_delete(transport, tmp_path, monkeypatch) -> None:
    """What a notebook does (docs/python-api.md): render, submit, status, logs, wait, delete."""
    with fake_cluster(transport, tmp_path, monkeypatch) as (api, client):
        for path in (CONFIGMAPS, CLAIMS, PYTORCHJOBS):
            api.route("POST", path, 201)
        manifests = client.render("pytorchjob", name="demo", validate_against="offline")
        created = client.submit(manifests=manifests, validate_against="offline")
        job = next(d for d in manifests.documents if d["kind"] == "PyTorchJob")
        in_submit_order = [job, *(d for d in manifests.documents if d is not job)]  # job first
        assert created == [
            f"{d['kind'].lower()}/{d['metadata']['name']} created in team" for d in in_submit_order
        ]
        running = {**JOB, "status": {"conditions": [{"type": "Running", "status": "True"}]}}
        api.route("GET", f"{PYTORCHJOBS}/demo", 200, running)
        api.route("GET", PODS, 200, {"kind": "PodList", "apiVersion": "v1", "items": [
            {"metadata": {"name": "demo-worker-0"}, "status": {"phase": "Pending"}}]})  # fmt: skip
        api.route("GET", f"{PODS}/demo-worker-0/log", 200, "step 1\n")
        status = client.status("demo")
        assert status.state == "Running" and str(status).startswith("PyTorchJob team/demo")
        assert [str(line) for line in client.logs("demo")] == ["[demo-worker-0] step 1"]
        with pytest.raises(WaitTimeout) as timeout:
            client.wait("demo", timeout="0.3s", interval=0.1)
        assert timeout.value.exit_code == exit_codes.WAIT_TIMEOUT
        assert str(timeout.value).startswith("PyTorchJob team/demo: still running after 0.3s")
        failed = {**JOB, "status": {"conditions": [{"type": "Failed", "status": "True"}]}}
        api.route("GET", f"{PYTORCHJOBS}/demo", 200, failed)
        end = client.wait("demo")
        assert (end.state, end.succeeded, str(end)) == (
            "Failed", False, "PyTorchJob team/demo: Failed"
        )  # fmt: skip
        api.route("DELETE", f"{PYTORCHJOBS}/demo", 200, SUCCESS)
        assert client.delete("demo")[0] == "pytorchjob/demo deleted"
    posted = [r["body"] for r in api.calls("POST")]
    assert posted == in_submit_order


def test_submit_a_file_and_validate_files(tmp_path, monkeypatch) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(config_map))
    bad.write_text(yaml.safe_dump({**config_map, "data": {"n": 1}}))
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("POST", CONFIGMAPS, 201)
        assert client.submit(filename=str(good)) == ["configmap/c created in team"]
        checked = client.validate(str(good), str(bad), validate_against="offline")
        with pytest.raises(KubeddpError) as err:
            client.validate(str(tmp_path / "missing.yaml"))
    assert len(checked.problems) == 1 and "data.n" in checked.problems[0]
    assert (checked.documents, checked.files) == (2, 2)
    assert err.value.exit_code == exit_codes.BAD_INPUT and "cannot read" in str(err.value)


def test_submit_takes_one_thing_to_submit() -> None:
    """A file, objects, or render options (with a KIND or without: the cluster's kind)."""
    for given in (
        {"kind": "pytorchjob", "filename": "x.yaml"},
        {"filename": "x.yaml", "manifests": []},
    ):
        with pytest.raises(KubeddpError) as err:
            Client().submit(**given)
        assert err.value.exit_code == exit_codes.BAD_INPUT and "-f FILE or KIND" in str(err.value)


def test_dry_run_client_sends_nothing() -> None:
    (text,) = Client(kubeconfig="/nonexistent", say=lambda line: None).submit(
        "indexedjob", dry_run="client", validate_against="offline"
    )
    assert "kind: Job" in text


def test_importing_the_api_imports_neither_torch_nor_the_kubernetes_client() -> None:
    code = (
        "import sys; import kubeddp.client; "
        "print(sorted({'torch', 'kubernetes', 'jsonschema'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"


def test_the_cli_is_a_layer_over_the_api() -> None:
    """tools/cli/main.py reaches the cluster, the renderer and the validator only through
    kubeddp.tools.cli.client: there is one implementation of each command."""
    tree = ast.parse((REPO / "tools" / "cli" / "main.py").read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    cluster = {"kube", "jobs", "job_status", "job_logs", "job_lookup", "diagnosis"}
    inner = {f"kubeddp.tools.cluster.{name}" for name in cluster}
    inner.add("kubeddp.tools.manifests.validate")
    assert not inner & imported, imported
    assert "kubeddp.tools.manifests.chart.render" not in imported
    assert "kubeddp.tools.cli.client" in imported
