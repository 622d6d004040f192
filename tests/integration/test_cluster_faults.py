"""The cluster commands as real processes against a stand-in API server (tests/helpers/fake_api.py)
that a test controls: a name that is not a Kubernetes name never reaches the server, and a
server that accepts connections but never answers ends every command within its timeout.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kubeddp.trainer.exit_codes import BAD_INPUT, CLUSTER_ERROR
from tests.helpers import fake_api, procs

pytestmark = pytest.mark.timeout(120)
ENV_KEEP = ("PATH", "HOME", "LANG", "PYTHONPATH")
# Requests a command sends to a server that never answers: one, and submit's first object
# after its StorageClass lookup (which only notes the failure)
HUNG_REQUESTS = 2
INJECTIONS = {
    "delete": ("delete", "../../../../../../api/v1/namespaces/kube-system/secrets/db-password"),
    "status": ("status", "x?dryRun=All"),
    "logs": ("logs", "x/../../secrets"),
    "wait": ("wait", "x%2F..%2Fy"),
}


def kubeddp(tmp_path: Path, server: fake_api.FakeApiServer, *argv: str) -> procs.Split:
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", server.url)
    env["KUBECONFIG"] = str(kubeconfig)
    return procs.run_split(procs.kubeddp_argv(*argv), tmp_path, timeout=60, env=env)


@pytest.mark.parametrize("command", sorted(INJECTIONS))
def test_a_name_that_is_no_kubernetes_name_never_reaches_the_server(command, tmp_path) -> None:
    with fake_api.running() as server:
        done = kubeddp(tmp_path, server, *INJECTIONS[command])
        time.sleep(0.2)  # a request in flight would be recorded by now
        requests = list(server.requests)
    assert requests == [], f"the API server received {requests}"
    assert done.code == BAD_INPUT, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "is not a Kubernetes name" in line and "deleted" not in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ("status", "demo"),
        ("delete", "demo"),
        ("wait", "demo", "--timeout", "60"),
        ("logs", "demo"),
        ("submit", "pytorchjob", "--validate-against", "offline"),
    ],
    ids=lambda argv: argv[0],
)
def test_a_server_that_never_answers_ends_the_command_in_its_timeout(argv, tmp_path) -> None:
    with fake_api.running() as server:
        server.misbehaviour = "hang"
        done = kubeddp(tmp_path, server, *argv, "--request-timeout", "2")
    assert done.code == CLUSTER_ERROR, done.stderr
    # one error; submit may first note the StorageClasses it could not read, render its storage
    (line,) = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert "did not answer within 2s" in line, line
    # it gave up on the first request that hung, not after retrying (`wait` has 60 s)
    assert len(server.requests) <= HUNG_REQUESTS, server.requests


def test_render_falls_back_offline_when_the_server_hangs(tmp_path) -> None:
    with fake_api.running() as server:
        server.misbehaviour = "hang"
        done = kubeddp(tmp_path, server, "render", "pytorchjob")
    assert done.code == 0, done.stderr
    assert "kind: PyTorchJob" in done.stdout
    (line,) = [line for line in done.stderr.splitlines() if "Checkpoints:" not in line]
    assert "validating offline" in line and "did not answer" in line
    assert len(server.requests) <= HUNG_REQUESTS, server.requests
