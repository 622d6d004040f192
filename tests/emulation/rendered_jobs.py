"""What the emulated-cluster tests share: a job rendered by `kubeddp render` as the pods the
operator would make, the settings of the short runs, and what a finished run must show.

Test modules import this (never one another: pytest would load a test module twice)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cluster import EmulatedCluster
from operator_env import JobPlan, load_documents, plan_from_documents

from tests.helpers import faults, helm_install

REPO = Path(__file__).resolve().parents[2]
KUBEDDP = [sys.executable, "-m", "kubeddp"]
# A tiny regression run: a handful of gloo steps, checkpoints, an eval.
TINY = [
    "--set", "workload.name=regression",
    "--set", "train.max_steps=20",
    "--set", "train.log_every=5",
    "--set", "train.eval_batches=2",
    "--set", "checkpoint.every_steps=10",
    "--set", "ddp.backend=gloo",
    "--set", "ddp.device=cpu",
]  # fmt: skip
# Long enough to scrape /metrics or kill a pod while the job trains (~100 ms/step here).
LONGER = ["--set", "train.max_steps=80", "--set", "train.epochs=10"]
# What a job may take from its start to its end: generous, as it shares 2 cores with other
# tests (make test runs them side by side), not a measure of speed.
JOB_SECONDS = 300
DONE = re.compile(r"final loss ([0-9.]+) \(start ([0-9.]+)\)")
# A worker that SIGKILLs itself at every start (an OOM loop), and where the image holds it.
OOM_SCRIPT = Path(__file__).with_name("oom_worker.py")
OOM_IMAGE_SCRIPT = "/app/oom_worker.py"
BUDGET = 2  # retries.without_progress of the OOM-loop jobs


def render(kind: str, *args: str) -> JobPlan:
    argv = [*KUBEDDP, "render", kind, "--image", "kubeddp:cpu", "--validate-against", "offline"]
    done = subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )
    assert done.returncode == 0, f"kubeddp render failed:\n{done.stderr}"
    # `kubectl apply -f` of the file, through the API server's admission (Trainer's webhook)
    return plan_from_documents(helm_install.applied(load_documents(done.stdout)))


def exits(cluster: EmulatedCluster) -> list[tuple[str, int | None]]:
    """(pod, exit code) of every container end the controllers saw, in order."""
    found = []
    for event in cluster.status.events:
        pod, _, rest = event.partition(": exit ")
        if rest:
            code = rest.split(" ", 1)[0]
            found.append((pod, None if code == "None" else int(code)))
    return found


def slow_steps(work_ms: int, samples: int = 2000) -> list[str]:
    """Steps of at least `work_ms` (every rank's forward sleeps, the regression model and data
    otherwise): a test that preempts a pod after the first checkpoint does so while it trains."""
    return [*faults.settings("slow", -1, 0, samples=samples, work_ms=work_ms),
            "--env", f"PYTHONPATH={REPO}"]  # the image would hold the workload  # fmt: skip


def first_complete_checkpoint(cluster: EmulatedCluster, timeout: float = JOB_SECONDS) -> object:
    # a finished checkpoint: ckpt-<step>/COMPLETE is written last, then renamed into place
    return cluster.run_until(
        lambda: any(cluster.volume("pvc-").glob("ckpt-*/COMPLETE")),
        timeout,
        "a complete checkpoint on the claim",
    )


def assert_trained(cluster: EmulatedCluster, world_size: int) -> None:
    """rank 0 reported the expected world size, and the loss fell."""
    logs = cluster.all_logs()
    sizes = {int(s) for s in re.findall(r"\| world size (\d+) \(gloo", logs)}
    assert sizes == {world_size}, f"world sizes {sizes}, expected {world_size}\n{logs[-3000:]}"
    done = DONE.findall(logs)
    assert done, f"no final loss line\n{cluster.log_tails()}"
    final, start = (float(x) for x in done[-1])
    assert final < start, f"loss did not fall: start {start}, final {final}"


def assert_resumed_from(output: str, fetched_step: int) -> None:
    """A recreated pod's first start resumes from the checkpoint it fetched from the keeper, or
    from a peer's in-memory snapshot when one is newer."""
    resumed = re.findall(r"resumed from (\S+) \(step (\d+)", output)
    assert resumed, output[-3000:]
    source, step = resumed[0][0], int(resumed[0][1])
    newer_in_memory = step > fetched_step and source.startswith("memory://")
    assert step == fetched_step or newer_in_memory, (resumed, output[-3000:])
