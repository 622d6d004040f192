"""The teardown trap: 30 back-to-back 2-process DDP runs must all exit cleanly.

`destroy_process_group()` while a DDP module or optimizer is still referenced aborts a process
now and then (SIGABRT, "terminate called ..."). One abort in a few runs is easy to miss, so
this runs the real worker entrypoint (`kubeddp.trainer.worker.entry.main`: init, Trainer with
DDP and AdamW, a few steps, a checkpoint, close, teardown, then the worker's own exit,
`kubeddp.trainer.worker.leave`) 30 times in pairs of real processes and requires every one to
exit 0 with no abort in its output.

Starting 60 fresh interpreters that each import torch takes minutes on a small machine, so a
harness process imports torch once and forks the two ranks of each run (with the env torchrun
would give them); every rank still runs its own process group over TCP and ends as
`python -m kubeddp.trainer.worker` does.

To check that this test catches a regression, point the harness at a worker that keeps its
references alive: KUBEDDP_TEARDOWN_ENTRY=module:function (a `main(argv) -> int`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

from kubeddp.trainer.worker.leave import leave
from tests.helpers import procs
from tests.helpers.ports import free_port

RUNS = 30
RUN_TIMEOUT_SECONDS = 60.0
ENTRY_ENV = "KUBEDDP_TEARDOWN_ENTRY"
ABORT_MARKERS = ("terminate called", "SIGABRT", "Aborted", "core dumped")


def _rank_env(rank: int, port: int) -> dict[str, str]:
    """What torchrun's agent sets for a local worker of a one-node, two-process group."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": f"teardown-{port}",
    }


def _worker_args(checkpoint_dir: Path) -> list[str]:
    settings = [
        "workload.name=regression",
        "workload.samples=512",
        "train.max_steps=5",
        "train.log_every=5",
        f"checkpoint.dir={checkpoint_dir}",
        "metrics.port=0",
    ]
    return [arg for s in settings for arg in ("--set", s)]


def _start_rank(entry, rank: int, port: int, run_dir: Path) -> int:
    pid = os.fork()
    if pid:
        return pid
    # Child: become one rank and end as the worker's __main__ does.
    os.environ.update(_rank_env(rank, port))
    log = os.open(run_dir / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    leave(entry(_worker_args(run_dir / "ckpt")))


def _wait_pair(pids: list[int], timeout: float) -> list[str]:
    """Outcome per rank: 'exit N', 'signal N' or 'hung' (then killed)."""
    outcomes: dict[int, str] = {}
    end = time.monotonic() + timeout
    while len(outcomes) < len(pids) and time.monotonic() < end:
        for pid in pids:
            if pid in outcomes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
                outcomes[pid] = f"signal {sig}" if sig else f"exit {os.WEXITSTATUS(status)}"
        time.sleep(0.05)
    for pid in pids:
        if pid not in outcomes:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            outcomes[pid] = "hung"
    return [outcomes[pid] for pid in pids]


def harness(runs: int, out_dir: Path) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Import once what every rank imports (DDP pulls in torch._dynamo lazily: seconds).
    import torch._dynamo  # noqa: F401

    from kubeddp.trainer.worker import distributed, loop  # noqa: F401
    from kubeddp.trainer.worker.checkpoint import manager  # noqa: F401

    module, _, name = os.environ.get(ENTRY_ENV, "kubeddp.trainer.worker.entry:main").partition(":")
    entry = getattr(importlib.import_module(module), name)
    results = []
    for i in range(runs):
        run_dir = out_dir / f"run{i:02d}"
        run_dir.mkdir(parents=True)
        port = free_port()
        pids = [_start_rank(entry, rank, port, run_dir) for rank in (0, 1)]
        outcomes = _wait_pair(pids, RUN_TIMEOUT_SECONDS)
        logs = [(run_dir / f"rank{r}.log").read_text(errors="replace") for r in (0, 1)]
        aborted = [m for log in logs for m in ABORT_MARKERS if m in log]
        results.append(
            {
                "run": i,
                "outcomes": outcomes,
                "abort_markers": aborted,
                "trained": "done: 5 steps" in logs[0],
                "finished": "[kubeddp] finished" in logs[0],
            }
        )
    return {"entry": f"{module}:{name}", "results": results}


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_thirty_two_process_runs_end_without_abort(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "tests.integration.test_teardown", str(RUNS), str(tmp_path)]
    env = procs.child_env()
    env.pop(ENTRY_ENV, None)
    done = procs.run(argv, tmp_path / "harness.log", timeout=840, env=env)
    assert done.code == 0, done.output[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    results = summary["results"]
    assert len(results) == RUNS
    bad = [
        r
        for r in results
        if r["outcomes"] != ["exit 0", "exit 0"]
        or r["abort_markers"]
        or not r["trained"]
        or not r["finished"]
    ]
    assert not bad, f"{len(bad)}/{RUNS} runs did not end cleanly (logs in {tmp_path}): {bad}"


if __name__ == "__main__":
    count, directory = int(sys.argv[1]), Path(sys.argv[2])
    summary_data = harness(count, directory)
    (directory / "summary.json").write_text(json.dumps(summary_data, indent=1))
    failed = [r for r in summary_data["results"] if r["outcomes"] != ["exit 0", "exit 0"]]
    print(f"{summary_data['entry']}: {count} runs, {len(failed)} not clean")
