"""Checkpoint benchmarks: the training stall a checkpoint costs (async vs synchronous save of a
model over 100 MB), and recovery after a worker is killed (time from SIGKILL to the first
step after resume, and steps lost).

    python -m tests.bench.bench_checkpoint          # prints both results as JSON

`tests.bench.run` calls bench_checkpoint_stall() and bench_recovery(); each returns a dict
(ratio, against, absolute, goal, note, and the raw numbers).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from kubeddp.trainer import constants
from kubeddp.trainer.config import WorkloadConfig
from kubeddp.trainer.worker import checkpoint as ckpt
from kubeddp.trainer.workloads.regression import mse_loss
from tests.helpers import checkpoints as ck
from tests.helpers import procs, workloads

BIG_WIDTH = 4096  # two 4096x4096 layers: 33.6 M parameters, 134 MB in fp32
STALL_STEPS = 40
STALL_EVERY = 10
WINDOW_STEPS = 5  # steps after a save that count towards its stall (the write runs meanwhile)
RUN_TIMEOUT = 600.0


def big_model(cfg: WorkloadConfig) -> tuple[nn.Module, object]:
    """An MLP over the regression data whose weights take >100 MB (cheap per step on CPU)."""
    model = nn.Sequential(
        nn.Linear(cfg.input_dim, BIG_WIDTH),
        nn.ReLU(),
        nn.Linear(BIG_WIDTH, BIG_WIDTH),
        nn.ReLU(),
        nn.Linear(BIG_WIDTH, BIG_WIDTH),
        nn.ReLU(),
        nn.Linear(BIG_WIDTH, 1),
    )
    return model, mse_loss


def _model_megabytes() -> float:
    model, _ = big_model(WorkloadConfig())
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6


def _stall_run(work: Path, async_save: bool) -> dict:
    """One `kubeddp train` run; the stall is the step time above the median, per checkpoint."""
    name = "async" if async_save else "sync"
    summary = work / f"{name}.json"
    argv = procs.kubeddp_argv("train", "--nproc", "1")
    for item in (
        "workload.name=custom",
        "workload.model=tests.bench.bench_checkpoint:big_model",
        "workload.data=tests.helpers.workloads:regression_data",
        "workload.samples=4096",
        "train.batch_size=16",
        f"train.max_steps={STALL_STEPS}",
        "train.eval_every=1000",
        "train.log_every=10",
        f"checkpoint.dir={work / name}",
        f"checkpoint.every_steps={STALL_EVERY}",
        "checkpoint.keep=2",
        f"checkpoint.async_save={str(async_save).lower()}",
        "metrics.enabled=false",
    ):
        argv += ["--set", item]
    env = procs.child_env({constants.ENV_SUMMARY_FILE: str(summary), "OMP_NUM_THREADS": "1"})
    done = procs.run(argv, work / f"{name}.log", RUN_TIMEOUT, env)
    if done.code != 0:
        raise RuntimeError(f"{name} run failed ({done.code}); log {work / f'{name}.log'}")
    ends = json.loads(summary.read_text())["step_end_unix"]
    # intervals[i] runs from the end of step i+1 to the end of step i+2, so the save made
    # after step s delays intervals[s-1]; a background save may also slow the next few.
    intervals = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    blocking, window = [], []
    for step in range(STALL_EVERY, STALL_STEPS, STALL_EVERY):
        base = statistics.median(intervals[step - 6 : step - 1])  # the steps just before
        blocking.append(intervals[step - 1] - base)
        window.append(sum(intervals[step - 1 : step - 1 + WINDOW_STEPS]) - WINDOW_STEPS * base)
    return {
        "step_seconds": statistics.median(intervals),
        "stall_seconds": statistics.mean(window),
        "blocking_seconds": statistics.mean(blocking),
    }


def _loop_blocking(work: Path, repeats: int = 3) -> dict:
    """Seconds the training loop itself waits per save, timed around the calls it makes."""
    model, _ = big_model(WorkloadConfig())
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, WorkloadConfig().input_dim)).sum().backward()
    optimizer.step()  # AdamW moments exist: the state is the size a real checkpoint has

    def state() -> dict:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    sync_times, async_times = [], []
    for i in range(repeats):
        start = time.perf_counter()
        ckpt.write_checkpoint(work / "sync-direct", i, ckpt.to_cpu(state()), "", keep=1)
        sync_times.append(time.perf_counter() - start)
    writer = ckpt.AsyncCheckpointWriter(work / "async-direct", keep=1, config_yaml="")
    for i in range(repeats + 1):
        writer.wait()  # in training the previous write ended steps ago: not part of the stall
        start = time.perf_counter()
        writer.save(i, writer.snapshot(state()), blocking=False)
        async_times.append(time.perf_counter() - start)
    writer.wait()
    return {
        "sync": statistics.median(sync_times),
        "async_first": async_times[0],  # allocates the snapshot's memory
        "async": statistics.median(async_times[1:]),  # reuses it
    }


def bench_checkpoint_stall() -> dict:
    """Async vs synchronous save of a >100 MB model: how long the training loop is blocked per
    checkpoint (timed directly), and the slowdown of real `kubeddp train` runs."""
    with tempfile.TemporaryDirectory(prefix="kubeddp-bench-ckpt-") as tmp:
        work = Path(tmp)
        blocked = _loop_blocking(work)
        size_mb = (ck.newest(work / "sync-direct").path / "state.pt").stat().st_size / 1e6
        sync = _stall_run(work, async_save=False)
        asyn = _stall_run(work, async_save=True)
    return {
        "name": "training loop blocked per checkpoint, async vs synchronous save",
        "ratio": blocked["async"] / blocked["sync"],
        "against": "synchronous torch.save + fsync in the training loop",
        "absolute": (
            f"async {blocked['async']:.3f}s (first save {blocked['async_first']:.3f}s) vs sync "
            f"{blocked['sync']:.3f}s per checkpoint of {size_mb:.0f} MB"
        ),
        "goal": "<= 0.5",
        "note": (
            f"model {_model_megabytes():.0f} MB of weights + AdamW state, CPU; in 40-step "
            f"`kubeddp train` runs (checkpoint every {STALL_EVERY} steps, step "
            f"{sync['step_seconds'] * 1000:.0f} ms) the {WINDOW_STEPS} steps from a save on took "
            f"{asyn['stall_seconds']:.2f}s (async) vs {sync['stall_seconds']:.2f}s (sync) "
            "longer than usual: on a busy 2-core machine the background writer takes CPU "
            "from training"
        ),
        "sync_blocked_seconds": blocked["sync"],
        "async_blocked_seconds": blocked["async"],
        "async_first_blocked_seconds": blocked["async_first"],
        "sync_run_stall_seconds": sync["stall_seconds"],
        "async_run_stall_seconds": asyn["stall_seconds"],
        "sync_run_save_step_extra_seconds": sync["blocking_seconds"],
        "async_run_save_step_extra_seconds": asyn["blocking_seconds"],
        "checkpoint_megabytes": size_mb,
    }


STEP_LINE = re.compile(r"^step (\d+)/", re.MULTILINE)


def bench_recovery() -> dict:
    """SIGKILL one of two workers mid-epoch; torchrun restarts the group, which resumes."""
    with tempfile.TemporaryDirectory(prefix="kubeddp-bench-recovery-") as tmp:
        work = Path(tmp)
        ckpt_dir = work / "ckpts"
        argv = ck.scenario_argv(ckpt_dir, "train.log_every=1", max_restarts=1)
        env = procs.child_env({workloads.DELAY_ENV: "0.002"})
        started = time.time()
        with procs.started(argv, work / "run.log", env) as run:
            procs.wait_until(lambda: STEP_LINE.search(run.output()), 300, "first step", run)
            cold_start = time.time() - started
            # Killed half-way between the checkpoints of steps 45 and 50: ~every_steps/2 lost.
            procs.wait_until(lambda: "step 48/" in run.output(), 300, "step 48", run)
            workers = procs.torchrun_workers(run.pid)
            killed_at_log = run.output()
            os.kill(workers[0], signal.SIGKILL)
            killed = time.time()
            step_at_kill = int(STEP_LINE.findall(killed_at_log)[-1])

            def first_step_after_resume() -> re.Match[str] | None:
                text = run.output()
                resumed = re.search(r"resumed from \S+ \(step (\d+)", text)
                if resumed is None:
                    return None
                return STEP_LINE.search(text, resumed.end())

            procs.wait_until(first_step_after_resume, 300, "a step after the resume", run)
            recovery = time.time() - killed
            resumed_step = int(re.search(r"resumed from \S+ \(step (\d+)", run.output())[1])
            code = run.wait(RUN_TIMEOUT)
        if code != 0:
            raise RuntimeError(f"the restarted run failed ({code}): {run.tail(20)}")
    lost = step_at_kill - resumed_step
    return {
        "name": "recovery after a killed worker (torchrun restart + resume)",
        "ratio": recovery / cold_start,
        "against": "cold start of the same job (launch to first step)",
        "absolute": f"{recovery:.1f}s from SIGKILL to the first step after resume",
        "note": (
            f"2 CPU processes, gloo, checkpoint every {ck.SAVE_EVERY} steps; killed at step "
            f"{step_at_kill}, resumed at step {resumed_step}: {lost} steps lost"
        ),
        "recovery_seconds": recovery,
        "cold_start_seconds": cold_start,
        "steps_lost": lost,
        "checkpoint_every_steps": ck.SAVE_EVERY,
    }


def main() -> int:
    results = {"stall": bench_checkpoint_stall(), "recovery": bench_recovery()}
    json.dump(results, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
