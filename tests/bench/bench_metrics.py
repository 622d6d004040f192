"""Per-step cost of the Prometheus metrics, metrics on vs off in the same training run.

A real Trainer (regression workload, one CPU process: the shortest step kubeddp has, so the
worst case for relative overhead) runs with its metrics object wrapped: the wrapper switches
the real TrainingMetrics on and off in alternating blocks of steps. Reported: the median step
period (one on_step call to the next) with metrics on and off, and the median cost of the
on_step call itself relative to the median step.

    .venv/bin/python tests/bench/bench_metrics.py      # prints the result as JSON
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BLOCK_STEPS = 25
EPOCHS = 40  # 58 steps per epoch: 2320 steps, ~46 blocks each way


class AlternatingMetrics:
    """Forwards to the real metrics in every other block of steps and times both kinds."""

    def __init__(self, real: Any, block: int) -> None:
        self.real = real
        self.block = block
        self.calls = 0
        self.last: float | None = None
        self.last_on = False
        self.periods: dict[bool, list[float]] = {True: [], False: []}
        self.call_seconds: list[float] = []

    def on_step(self, **values: Any) -> None:
        now = time.perf_counter()
        if self.last is not None and self.calls > 2 * self.block:  # skip the warm-up
            self.periods[self.last_on].append(now - self.last)
        on = (self.calls // self.block) % 2 == 0
        if on:
            self.real.on_step(**values)
            self.call_seconds.append(time.perf_counter() - now)
        self.last, self.last_on = now, on
        self.calls += 1

    def on_checkpoint(self, **values: Any) -> None:
        self.real.on_checkpoint(**values)

    def close(self) -> None:
        self.real.close()


def _child(checkpoint_dir: str) -> dict[str, float]:
    import torch

    from kubeddp.trainer.config import load_config
    from kubeddp.trainer.worker.distributed import init_distributed
    from kubeddp.trainer.worker.loop import Trainer

    torch.set_num_threads(1)  # what torchrun gives each worker
    cfg = load_config(
        None,
        [
            "workload.name=regression",
            f"train.epochs={EPOCHS}",
            "train.log_every=1000000",
            f"checkpoint.dir={checkpoint_dir}",
        ],
    )
    trainer = Trainer(cfg, init_distributed(cfg.ddp))
    assert trainer.metrics.enabled, "PROMETHEUS_MULTIPROC_DIR is not set for the child"
    probe = trainer.metrics = AlternatingMetrics(trainer.metrics, BLOCK_STEPS)
    trainer.fit()
    trainer.close()
    on = statistics.median(probe.periods[True])
    off = statistics.median(probe.periods[False])
    call = statistics.median(probe.call_seconds)
    return {
        "steps": probe.calls,
        "step_ms_median_metrics_on": on * 1e3,
        "step_ms_median_metrics_off": off * 1e3,
        "overhead_pct_step_medians": (on - off) / off * 100,
        "on_step_us_median": call * 1e6,
        "on_step_pct_of_step": call / off * 100,
    }


def bench_metrics_overhead(repeats: int = 3) -> dict[str, Any]:
    """Run the comparison `repeats` times in fresh processes; medians over the repeats."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kubeddp-bench-") as tmp:
            metrics_dir = Path(tmp) / "metrics"
            metrics_dir.mkdir()
            env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
            for name in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
                env.pop(name, None)
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(Path(tmp) / "ckpt")],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode != 0:
                raise RuntimeError(f"benchmark child failed:\n{done.stderr[-3000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    result: dict[str, Any] = {
        key: statistics.median(run[key] for run in runs) for key in runs[0] if key != "steps"
    }
    result["steps_per_run"] = runs[0]["steps"]
    result["repeats"] = repeats
    result["goal_pct"] = 1.0
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_child(sys.argv[2])))
    else:
        print(json.dumps(bench_metrics_overhead(), indent=2))
