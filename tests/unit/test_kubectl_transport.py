"""The cluster commands without the Kubernetes Python client: through a real `kubectl proxy`
(the pinned kubectl of tests/helpers/helm_cli.py) against the fake API server
(tests/helpers/fake_api.py, a real HTTP server). kubeddp runs in a subprocess where
`kubernetes` cannot be imported, so it must choose kubectl; each scenario also runs in-process
with the client, and both must send the same requests and print the same lines.

kubectl is started through a wrapper that records its pid, so each test can check that the
proxy is gone when the command ends: after success, an error, Ctrl-C and a SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from tests.helpers import admission, fake_api, helm_cli
from tests.helpers.cluster_commands import run as run_in_process
from tests.helpers.fake_api import TOKEN, status_body
from tests.helpers.ports import free_port
from tests.helpers.render import secret_values_masked

REPO = Path(__file__).resolve().parents[2]
NS = fake_api.NAMESPACE
PYTORCHJOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
CLAIMS = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
SERVICES = f"/api/v1/namespaces/{NS}/services"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
NETWORK_POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
COMMAND_SECONDS = 60

pytestmark = pytest.mark.timeout(300)

# kubeddp with the client unimportable: the transport must be kubectl. The `sdk` extra's models
# go too: kubeflow-training brings the client, so no install has one without the other.
# SIGINT as at a terminal: a test runner started in the background (or a test that ran launch
# in-process) may hand its children an ignored SIGINT, and Ctrl-C would then never arrive.
WITHOUT_CLIENT = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.modules["kubernetes"] = sys.modules["kubeflow"] = None
    from kubeddp.tools.cli.main import main
    raise SystemExit(main(sys.argv[1:]))
    """
)

JOB = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "demo"}}
JOB_STATUS = {
    **JOB,
    "status": {
        "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}],
        "replicaStatuses": {"Worker": {"active": 2}},
    },
}
PODS_LIST = {
    "kind": "PodList",
    "apiVersion": "v1",
    "items": [
        {"metadata": {"name": f"demo-worker-{i}"}, "spec": {"nodeName": f"n{i}"},
         "status": {"phase": "Running", "containerStatuses": [{"restartCount": i}]}}
        for i in range(2)
    ],
}  # fmt: skip
SUCCESS = {"kind": "Status", "apiVersion": "v1", "status": "Success"}


def _echo(api: fake_api.FakeApiServer) -> Callable[[], object]:
    return lambda: api.calls("POST")[-1]["body"]


def _status(api: fake_api.FakeApiServer) -> None:
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, JOB_STATUS)
    api.route("GET", PODS, 200, PODS_LIST)
    for i in range(2):
        api.route("GET", f"{PODS}/demo-worker-{i}/log", 200, f"step {i}\n")


def _submit(api: fake_api.FakeApiServer) -> None:
    for path in (CONFIGMAPS, CLAIMS, SERVICES, DEPLOYMENTS, PYTORCHJOBS, SECRETS, NETWORK_POLICIES):
        api.route("POST", path, 201, _echo(api))


def _trainer(api: fake_api.FakeApiServer) -> None:
    """Trainer's webhook refuses the TrainJob twice (its cache has not seen the runtime)."""
    for path in (CONFIGMAPS, CLAIMS):
        api.route("POST", path, 201, _echo(api))
    api.admission = admission.with_trainer(lag=2, namespace=NS)


def _delete(api: fake_api.FakeApiServer) -> None:
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, JOB_STATUS)  # the kind, found by the name
    api.route("DELETE", f"{PYTORCHJOBS}/demo", 200, SUCCESS)
    api.route("DELETE", f"{CONFIGMAPS}/demo-config", 200, SUCCESS)


def _logs(api: fake_api.FakeApiServer) -> None:
    ended = {"conditions": [{"type": "Succeeded", "status": "True"}]}  # a follow ends with it
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, {**JOB, "status": ended})
    api.route("GET", PODS, 200, PODS_LIST)
    for i in range(2):
        api.route("GET", f"{PODS}/demo-worker-{i}/log", 200, f"hello {i}\nbye {i}\n")


def _missing(api: fake_api.FakeApiServer) -> None:
    details = {"name": "nope", "group": "kubeflow.org", "kind": "pytorchjobs"}
    body = status_body(404, "NotFound", 'pytorchjobs.kubeflow.org "nope" not found', details)
    api.route("GET", f"{PYTORCHJOBS}/nope", 404, body)


def _exists(api: fake_api.FakeApiServer) -> None:
    """The ConfigMap is made between submit's look for it and its create (after the job's)."""
    api.route("POST", PYTORCHJOBS, 201, _echo(api))
    details = {"name": "demo-config", "kind": "configmaps"}
    api.route("POST", CONFIGMAPS, 409, status_body(409, "AlreadyExists", "exists", details))


def _forbidden(api: fake_api.FakeApiServer) -> None:
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, JOB_STATUS)
    body = status_body(403, "Forbidden", 'pytorchjobs.kubeflow.org "demo" is forbidden')
    api.route("DELETE", f"{PYTORCHJOBS}/demo", 403, body)


def _crd(api: fake_api.FakeApiServer) -> None:
    api.route("GET", CRD_PATH + "pytorchjobs.kubeflow.org", 404, "404 page not found")


def _misbehaving(mode: str) -> Callable[[fake_api.FakeApiServer], None]:
    def routes(api: fake_api.FakeApiServer) -> None:
        api.misbehaviour = mode

    return routes


SUBMIT = ["submit", "pytorchjob", "--name", "demo", "--nodes", "2", "--validate-against"]
SUBMIT_TRAINJOB = ["submit", "trainjob", "--name", "demo", "--validate-against", "offline"]
SCENARIOS = {  # name: (routes, argv, exit code)
    "status": (_status, ["status", "demo"], 0),
    "status-json": (_status, ["status", "demo", "-o", "json"], 0),
    "submit": (_submit, [*SUBMIT, "offline"], 0),
    "submit-dry-run": (_submit, [*SUBMIT, "offline", "--dry-run", "server"], 0),
    "submit-trainjob": (_trainer, SUBMIT_TRAINJOB, 0),
    "delete": (_delete, ["delete", "demo"], 0),
    "logs": (_logs, ["logs", "demo", "--tail", "5"], 0),
    "logs-follow": (_logs, ["logs", "demo", "--follow"], 0),
    "404": (_missing, ["status", "nope"], exit_codes.CLUSTER_ERROR),
    "409": (_exists, [*SUBMIT, "offline"], exit_codes.CLUSTER_ERROR),
    "403": (_forbidden, ["delete", "demo"], exit_codes.CLUSTER_ERROR),
    "crd-missing": (_crd, [*SUBMIT, "cluster"], exit_codes.CLUSTER_ERROR),
    # A proxy in front of the API server (not kubectl's) answers 502; a login page; no object.
    "502": (_misbehaving("502"), ["status", "demo"], exit_codes.CLUSTER_ERROR),
    "html": (_misbehaving("html"), ["status", "demo"], exit_codes.CLUSTER_ERROR),
    "wrong-kind": (_misbehaving("wrong-kind"), ["delete", "demo"], exit_codes.CLUSTER_ERROR),
}


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A kubectl wrapper that records each pid (exec keeps it), and that pid file."""
    binary = helm_cli.require(helm_cli.KUBECTL, "kubectl")
    pids = tmp_path / "kubectl.pids"
    wrapper = tmp_path / "kubectl-recorded"
    arguments = tmp_path / "kubectl.args"
    wrapper.write_text(
        f'#!/bin/sh\necho $$ >> "{pids}"\necho "$@" >> "{arguments}"\nexec "{binary}" "$@"\n'
    )
    wrapper.chmod(0o755)
    yield wrapper, pids
    for pid in _recorded(pids):  # a failed test leaves nothing running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _recorded(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.is_file() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def assert_proxies_gone(pids: Path, expected: int = 1) -> None:
    recorded = _recorded(pids)
    assert len(recorded) == expected, recorded
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in recorded) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in recorded), f"kubectl proxy left running: {recorded}"


def _env(kubeconfig: Path, wrapper: Path, home: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "KUBEDDP_HELM": "library",  # submit renders as in the test process
        "HOME": str(home),
        "KUBECONFIG": str(kubeconfig),
        "KUBEDDP_KUBECTL": str(wrapper),
        "PYTHONPATH": str(REPO),
    }


def start(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WITHOUT_CLIENT, *argv],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: killed as a whole if the test fails
    )


def run_kubectl(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    proc = start(argv, env, cwd)
    try:
        out, err = proc.communicate(timeout=COMMAND_SECONDS)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def run_client(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_in_process(argv, capsys)  # the client path, as test_cluster_contract runs it


def _sent(api: fake_api.FakeApiServer) -> list[tuple]:
    """The requests, each keeper Secret's value masked: every render makes a new one."""
    return [
        (r["method"], r["raw_path"], _masked(r["body"]), r["authorization"]) for r in api.requests
    ]


def _masked(body: object) -> object:
    return secret_values_masked([body])[0] if isinstance(body, dict) else body


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_kubectl_and_client_send_the_same_and_say_the_same(
    scenario: str, kubectl, tmp_path: Path, monkeypatch, capsys
) -> None:
    routes, argv, expected = SCENARIOS[scenario]
    wrapper, pids = kubectl
    monkeypatch.setenv("KUBEDDP_HELM", "library")
    answers = {}
    for transport in ("client", "kubectl"):
        with fake_api.running(tmp_path) as api:  # TLS: kubectl sends a token only so
            routes(api)
            kubeconfig = fake_api.write_kubeconfig(
                tmp_path / f"{transport}.yaml", api.url, api.ca_pem
            )
            if transport == "client":
                monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
                code, out, err = run_client(argv, capsys)
            else:
                code, out, err = run_kubectl(argv, _env(kubeconfig, wrapper, tmp_path), tmp_path)
            answers[transport] = (code, out, err.replace(api.url, "SERVER"), _sent(api))
    code, out, err, sent = answers["kubectl"]
    assert code == expected, err
    assert_proxies_gone(pids)
    assert all(auth == f"Bearer {TOKEN}" for *_, auth in sent), sent  # kubectl authenticated
    if scenario == "logs-follow":  # two pods stream at once: lines and requests interleave
        answers = {
            k: (c, sorted(o.splitlines()), e, sorted(s)) for k, (c, o, e, s) in answers.items()
        }
    if scenario.startswith("status"):  # the pods' /metrics are read side by side
        answers = {k: (c, o, e, sorted(s)) for k, (c, o, e, s) in answers.items()}
    assert answers["kubectl"] == answers["client"]
    if expected:  # one error line, the last (submit notes the storage first)
        errors = [line for line in err.splitlines() if ": error: " in line]
        assert errors == err.splitlines()[-1:], err


def test_unreachable_server_is_one_line_as_with_the_client(
    kubectl, tmp_path: Path, monkeypatch, capsys
) -> None:
    wrapper, pids = kubectl
    url = f"http://127.0.0.1:{free_port()}"
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", url)
    line = re.compile(
        rf"kubeddp status: error: cannot reach the API server at {re.escape(url)} \(.+\); "
        r"check --context/--kubeconfig and that the cluster is up"
    )
    code, out, err = run_kubectl(["status", "demo"], _env(kubeconfig, wrapper, tmp_path), tmp_path)
    assert code == exit_codes.CLUSTER_ERROR and out == ""
    assert line.fullmatch(err.strip()), err
    assert "connection refused" in err
    assert_proxies_gone(pids)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    code, _, err = run_client(["status", "demo"], capsys)
    assert code == exit_codes.CLUSTER_ERROR and line.fullmatch(err.strip()), err


def test_a_server_that_never_answers_is_one_line_within_the_timeout(
    kubectl, tmp_path: Path
) -> None:
    wrapper, pids = kubectl
    with fake_api.running(tmp_path) as api:
        api.misbehaviour = "hang"
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", api.url, api.ca_pem)
        argv = ["status", "demo", "--request-timeout", "2"]
        code, out, err = run_kubectl(argv, _env(kubeconfig, wrapper, tmp_path), tmp_path)
    assert code == exit_codes.CLUSTER_ERROR and out == "", err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"kubeddp status: error: the API server at {api.url} did not answer "
                           "within 2s"), line  # fmt: skip
    assert_proxies_gone(pids)


def test_kubeconfig_list_is_merged_as_kubectl_merges_it(kubectl, tmp_path: Path) -> None:
    """The context is in the second file, current-context in the first: the namespace and
    the server come from the merged view (kubeddp reads it; kubectl authenticates with it)."""
    wrapper, pids = kubectl
    with fake_api.running(tmp_path) as api:
        _status(api)
        full = fake_api.kubeconfig_for(api.url, ca_pem=api.ca_pem)
        first = tmp_path / "first.yaml"
        first.write_text(
            f"apiVersion: v1\nkind: Config\ncurrent-context: {full['current-context']}\n"
        )
        second = fake_api.write_kubeconfig(tmp_path / "second.yaml", api.url, api.ca_pem)
        env = _env(first, wrapper, tmp_path)
        env["KUBECONFIG"] = os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)])
        code, out, err = run_kubectl(["status", "demo"], env, tmp_path)
        assert code == 0, err
        assert api.requests[0]["path"] == f"{PYTORCHJOBS}/demo"
        assert api.requests[0]["authorization"] == f"Bearer {TOKEN}"
    assert_proxies_gone(pids)


def test_bad_context_is_one_line_before_kubectl_starts(kubectl, tmp_path: Path) -> None:
    wrapper, pids = kubectl
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    env = _env(kubeconfig, wrapper, tmp_path)
    code, _, err = run_kubectl(["status", "demo", "--context", "nope"], env, tmp_path)
    assert code == exit_codes.CLUSTER_ERROR, err
    assert err.strip() == (
        f"kubeddp status: error: kubeconfig {kubeconfig} cannot be used (no context 'nope'); "
        "fix it or pass --kubeconfig/--context"
    )
    assert _recorded(pids) == []


def _socket_folder(tmp_path: Path) -> Path:
    (argument,) = re.findall(r"--unix-socket=(\S+)", (tmp_path / "kubectl.args").read_text())
    return Path(argument).parent


def test_ctrl_c_stops_the_proxy(kubectl, tmp_path: Path) -> None:
    """...and removes its socket, which only this user could reach while it ran."""
    wrapper, pids = kubectl
    with fake_api.running() as api:
        api.misbehaviour = "hang"  # the command waits for an answer that never comes
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", api.url)
        proc = start(["status", "demo"], _env(kubeconfig, wrapper, tmp_path), tmp_path)
        try:
            fake_api.wait_for_requests(api, 1, timeout=COMMAND_SECONDS)
            assert api.requests, "kubeddp never reached the API server through kubectl"
            folder = _socket_folder(tmp_path)
            assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=COMMAND_SECONDS)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == exit_codes.INTERRUPTED, err
    assert_proxies_gone(pids)
    assert not folder.exists()


def test_a_killed_kubeddp_takes_its_proxy_along(kubectl, tmp_path: Path) -> None:
    """SIGKILL runs no Python: the kernel ends kubectl (PR_SET_PDEATHSIG), if its next line to
    the closed stderr pipe has not ended it first."""
    wrapper, pids = kubectl
    with fake_api.running() as api:
        api.misbehaviour = "hang"
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", api.url)
        proc = start(["status", "demo"], _env(kubeconfig, wrapper, tmp_path), tmp_path)
        try:
            fake_api.wait_for_requests(api, 1, timeout=COMMAND_SECONDS)
            assert api.requests, "kubeddp never reached the API server through kubectl"
            proc.kill()  # kubeddp only, not its group
            proc.wait(timeout=COMMAND_SECONDS)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert_proxies_gone(pids)
    shutil.rmtree(_socket_folder(tmp_path))  # SIGKILL left it: no Python ran to remove it


def test_neither_kubectl_nor_client_says_what_to_install(tmp_path: Path) -> None:
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    env = _env(kubeconfig, tmp_path / "no-such-kubectl", tmp_path)
    for argv in (["status", "demo"], ["logs", "demo"], ["delete", "demo"]):
        code, out, err = run_kubectl(argv, env, tmp_path)
        assert code == exit_codes.BAD_INPUT and out == "", err
        (line,) = err.strip().splitlines()
        assert "install kubectl" in line and "pip install 'kubeddp[kube]'" in line, line


def test_a_kubectl_that_does_not_serve_is_one_line(tmp_path: Path) -> None:
    """`$KUBEDDP_KUBECTL` names a program that ends at once (here `true`): said, not waited."""
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    env = _env(kubeconfig, Path("/bin/true"), tmp_path)
    code, out, err = run_kubectl(["status", "demo"], env, tmp_path)
    assert code == exit_codes.CLUSTER_ERROR and out == "", err
    assert err.strip() == (
        "kubeddp status: error: kubectl proxy failed: it ended with exit code 0 without "
        "serving; fix the kubeconfig or --context"
    )
