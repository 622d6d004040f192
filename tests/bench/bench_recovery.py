"""Recovery time of an Indexed Job after one preempted pod, in the emulated cluster (root, netns).

    sudo .venv/bin/python tests/bench/bench_recovery.py --pods 6 32 --mode before after

Measures, with real processes (one network namespace per pod, the Job controller's real
pod-recreation back-off): from the preemption (SIGTERM + DisruptionTarget on pod index 2) to
the first training step logged after the job resumed from its checkpoint.
- before: `retries.rejoin=false`, as kubeddp did: every peer saves and exits (143/201); the
  pod failure policy Ignores all N failures, but they still grow the recreation back-off
  (10 s doubling per failed pod, at most 6 min), and N pods start again.
- after: the peers stay up and rejoin; only the preempted pod is recreated, 10 s later.
Not a test: the numbers go to docs/performance.md and the report. `--backoff-scale` shrinks the
back-off for a quick look (the printed numbers then are not the real ones).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "emulation"))

from cluster import EmulatedCluster  # noqa: E402
from operator_env import load_documents, plan_from_documents  # noqa: E402

LOST = 2  # the preempted pod's index
WORKLOAD = [
    "--set", "workload.name=regression",
    "--set", "workload.samples=16384",
    "--set", "train.max_steps=400",
    "--set", "train.epochs=50",
    "--set", "train.log_every=1",
    "--set", "train.eval_batches=1",
    "--set", "checkpoint.every_steps=5",
    "--set", "ddp.backend=gloo",
    "--set", "ddp.device=cpu",
]  # fmt: skip
RESUMED_STEP = re.compile(r"resumed from \S+ \(step \d+.*?\n(?:.*\n)*?step \d+/", re.MULTILINE)


def render(pods: int, rejoin: bool) -> list[dict]:
    argv = [sys.executable, "-m", "kubeddp", "render", "indexedjob", "--name", "rb",
            "--nodes", str(pods), "--nproc-per-node", "1", "--image", "kubeddp:cpu",
            "--validate-against", "offline", *WORKLOAD,
            "--set", f"retries.rejoin={'true' if rejoin else 'false'}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return load_documents(done.stdout)


def resumed_and_stepped(cluster: EmulatedCluster) -> bool:
    """Rank 0 (pod index 0) logged a training step after it resumed from a checkpoint."""
    return bool(RESUMED_STEP.search(cluster.logs("rb-0")))


def measure(pods: int, rejoin: bool, scale: float, timeout: float) -> dict[str, float | int]:
    cluster = EmulatedCluster(job_backoff_scale=scale)
    try:
        cluster.start(plan_from_documents(render(pods, rejoin)))
        cluster.run_until(
            lambda: any(cluster.volume("pvc-").glob("ckpt-*/COMPLETE")),
            timeout,
            "a checkpoint",
        )
        start = time.monotonic()
        cluster.preempt_pod(f"rb-{LOST}", grace_seconds=60)
        cluster.run_until(
            lambda: resumed_and_stepped(cluster), timeout, "the first step after resume"
        )
        seconds = time.monotonic() - start
        failed = sum(1 for e in cluster.status.events if ": exit " in e and "exit 0 " not in e)
        started = sum(len(times) - 1 for times in cluster.created_at.values())
        return {"seconds": round(seconds, 1), "failed_pods": failed, "pods_started": started}
    finally:
        cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[6, 32])
    parser.add_argument("--mode", nargs="+", choices=("before", "after"), default=["after"])
    parser.add_argument("--backoff-scale", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    for pods in args.pods:
        for mode in args.mode:
            result = measure(pods, mode == "after", args.backoff_scale, args.timeout)
            row = {"pods": pods, "mode": mode, "backoff_scale": args.backoff_scale, **result}
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
