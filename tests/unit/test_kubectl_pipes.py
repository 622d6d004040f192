"""The kubectl path cannot hang on a child's pipes: a kubectl wrapper (a site's auth script, a
version switcher) that leaves a background child holding kubectl's stdout and stderr. kubeddp
runs in a subprocess where the kubernetes client cannot be imported, against the fake API
server, with the pinned kubectl of tests/helpers/helm_cli.py behind such a wrapper; each run
must end within its hard timeout, and the child ends with the proxy's process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from tests.helpers import fake_api, helm_cli

REPO = Path(__file__).resolve().parents[2]
NS = fake_api.NAMESPACE
COMMAND_SECONDS = 60  # a hang is caught here; the commands take a few seconds
WITHOUT_CLIENT = textwrap.dedent(
    """
    import sys
    sys.modules["kubernetes"] = sys.modules["kubeflow"] = None
    from kubeddp.tools.cli.main import main
    raise SystemExit(main(sys.argv[1:]))
    """
)
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Path]:
    """Where the wrappers write their background child's pid; each is killed at the end."""
    pids = tmp_path / "children"
    yield pids
    for pid in (int(p) for p in pids.read_text().split()) if pids.is_file() else ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wrapper(tmp_path: Path, children: Path, then: str) -> Path:
    """A kubectl wrapper that starts `sleep` in the background (it inherits stdout and
    stderr, and keeps them open), records its pid, then runs `then`."""
    script = tmp_path / "kubectl-wrapper"
    script.write_text(f'#!/bin/sh\nsleep 300 &\necho $! >> "{children}"\n{then}\n')
    script.chmod(0o755)
    return script


def kubeddp(argv: list[str], kubectl: Path, kubeconfig: Path, cwd: Path) -> tuple[int, str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "KUBECONFIG": str(kubeconfig),
           "KUBEDDP_KUBECTL": str(kubectl), "PYTHONPATH": str(REPO)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", WITHOUT_CLIENT, *argv], env=env, cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=COMMAND_SECONDS)
    finally:
        if proc.poll() is None:  # it hung: the test fails, nothing is left running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_status_ends_and_takes_the_wrappers_child_along(tmp_path, children) -> None:
    kubectl = helm_cli.require(helm_cli.KUBECTL, "kubectl")
    script = wrapper(tmp_path, children, f'exec "{kubectl}" "$@"')
    with fake_api.running(tmp_path) as api:
        api.route("GET", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/demo", 200,
                  {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                   "metadata": {"name": "demo"}})  # fmt: skip
        api.route("GET", f"/api/v1/namespaces/{NS}/pods", 200,
                  {"kind": "PodList", "apiVersion": "v1", "items": []})  # fmt: skip
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", api.url, api.ca_pem)
        code, out, err = kubeddp(["status", "demo"], script, kubeconfig, tmp_path)
    assert code == 0, err
    assert out.startswith("PyTorchJob team/demo: Running"), out
    (child,) = [int(p) for p in children.read_text().split()]
    assert gone(child), "the wrapper's child outlived the command"


def test_a_kubectl_that_fails_is_one_line_though_a_child_holds_its_pipes(
    tmp_path, children
) -> None:
    script = wrapper(tmp_path, children, 'echo "error: the site login expired" >&2\nexit 1')
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:9")
    code, out, err = kubeddp(["status", "demo"], script, kubeconfig, tmp_path)
    assert code == exit_codes.CLUSTER_ERROR and out == "", err
    assert err.strip() == (
        "kubeddp status: error: kubectl proxy failed: the site login expired; fix the "
        "kubeconfig or --context"
    )
