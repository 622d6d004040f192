"""Every tutorial-style script that runs under `kubeddp train` (tests/helpers/tutorials.py) also
runs as a one-pod PyTorchJob rendered by `kubeddp render --script`, the way training-operator
would run it (its own network namespace, the operator's env, the manifest's command): a
tcp:// rendezvous, mp.spawn and mp.Process programs, a launch-era `--local_rank=${local_rank}`
passed through the manifest, and a relative snapshot that lands on the checkpoint claim (the
pod runs the program in /checkpoints). The jobs run side by side, one emulated cluster each."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster import EmulatedCluster
from operator_env import JobPlan, load_documents, plan_from_documents

from tests.helpers.tutorials import RUNS, SCRIPTS

pytestmark = [pytest.mark.netns, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
JOBS_SECONDS = 480  # all side by side on a loaded 2-core machine
IN_POD = {
    name: run
    for name, run in RUNS.items()
    if run.pod and name in __import__("os").environ.get("ONLY", name)
}


def render(name: str, script: str, args: list[str]) -> JobPlan:
    argv = [sys.executable, "-m", "kubeddp", "render", "pytorchjob", "--name", name,
            "--image", "kubeddp:cpu", "--validate-against", "offline", "--nodes", "1",
            "--nproc-per-node", "2", "--script", script, "--", *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, f"kubeddp render failed:\n{done.stderr}"
    return plan_from_documents(load_documents(done.stdout))


@pytest.mark.timeout(JOBS_SECONDS + 120)
def test_each_tutorial_script_runs_in_a_one_pod_job(
    cluster_factory: Callable[..., EmulatedCluster],
) -> None:
    clusters = {}
    for number, (name, run) in enumerate(IN_POD.items()):
        image_path = f"/app/{name}"
        cluster = cluster_factory(image_files={image_path: SCRIPTS / name})
        cluster.start(render(f"tut{number}", image_path, run.program_args))
        clusters[name] = cluster
    deadline = time.monotonic() + JOBS_SECONDS
    while any(c.tick().phase == "Running" for c in clusters.values()):
        if time.monotonic() > deadline:
            running = [f"{n}:\n{c.log_tails()}" for n, c in clusters.items()
                       if c.status.phase == "Running"]  # fmt: skip
            raise AssertionError("still running:\n" + "\n".join(running))
        time.sleep(0.2)
    failed = [
        f"{name}: {cluster.status}\n{cluster.log_tails()}"
        for name, cluster in clusters.items()
        if cluster.status.phase != "Succeeded"
        or not re.search(IN_POD[name].done, cluster.all_logs())
    ]
    assert not failed, "\n".join(failed)
    assert any(clusters["torchrun_snapshot.py"].volume("pvc-").glob("snapshot.pt"))


@pytest.mark.parametrize("name", [name for name, run in RUNS.items() if not run.pod])
def test_scripts_not_run_in_a_pod_say_why(name: str) -> None:
    assert RUNS[name].why, f"{name} is not run in a pod and the table does not say why"
    pytest.skip(f"{name}: {RUNS[name].why}")
