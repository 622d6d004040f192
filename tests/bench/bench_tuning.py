"""Tuning: DDP and DataLoader knobs (and torch.compile), each against the current defaults."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.bench_trainer import CharLM
from tests.bench.common import (
    BENCH_DIR,
    Row,
    StepTimes,
    bench_env,
    median,
    not_measured,
    run_job,
    spread,
    torchrun_cmd,
)

DEFAULTS = "defaults"

# name -> overrides; every row is that setting's throughput / the defaults' throughput.
KNOBS: dict[str, list[str]] = {
    "ddp.bucket_cap_mb=1": ["ddp.bucket_cap_mb=1"],
    "ddp.bucket_cap_mb=100": ["ddp.bucket_cap_mb=100"],
    "ddp.gradient_as_bucket_view=false": ["ddp.gradient_as_bucket_view=false"],
    "ddp.static_graph=true": ["ddp.static_graph=true"],
    "train.num_workers=1": ["train.num_workers=1"],
    "train.num_workers=2": ["train.num_workers=2"],
    "train.num_workers=1, persistent_workers=false": [
        "train.num_workers=1",
        "train.persistent_workers=false",
    ],
    "train.num_workers=1, prefetch_factor=4": ["train.num_workers=1", "train.prefetch_factor=4"],
}
QUICK_KNOBS = [
    "ddp.bucket_cap_mb=1",
    "ddp.gradient_as_bucket_view=false",
    "ddp.static_graph=true",
    "train.num_workers=1",
]
COMPILE = {"train.compile=true": ["train.compile=true"]}
COMPILE_TIMEOUT = 300.0  # inductor builds C++ kernels; on 2 busy cores that can take minutes


def _base(model: CharLM, steps: int) -> list[str]:
    return [
        *model.overrides(),
        f"train.max_steps={steps}",
        "train.eval_batches=1",
        "checkpoint.resume=never",
        "metrics.enabled=false",  # one Trainer after another in one process: no port churn
    ]


def run_knobs(
    work: Path,
    tag: str,
    model: CharLM,
    knobs: dict[str, list[str]],
    steps: int,
    reps: int,
    timeout: float,
) -> list[Row]:
    out = work / tag
    out.mkdir(parents=True, exist_ok=True)
    configs = [(DEFAULTS, []), *[(f"k{i}", o) for i, o in enumerate(knobs.values())]]
    args = [
        f"--out-dir={out}",
        f"--reps={reps}",
        "--base=" + json.dumps(_base(model, steps)),
        "--configs=" + json.dumps(configs),
    ]
    cmd = torchrun_cmd(2, BENCH_DIR / "tuning_worker.py", args)
    run_job(cmd, bench_env(), work / f"{tag}.log", timeout)

    def sps(name: str, rep: int) -> float:
        return StepTimes.read(out / f"{name}-{rep}.json").samples_per_second()

    def cpu(name: str, rep: int) -> float:
        return StepTimes.read(out / f"{name}-{rep}.json").cpu_seconds_per_step()

    defaults = [sps(DEFAULTS, rep) for rep in range(reps)]
    rows = []
    for i, label in enumerate(knobs):
        wall = [sps(f"k{i}", rep) / defaults[rep] for rep in range(reps)]
        wall_note = f"wall clock {median(wall):.3f} ({spread(wall)})"
        if "num_workers" in label:
            # Loader workers are other processes: rank 0's CPU time would leave their work out.
            ratio, against, note = median(wall), "current defaults, wall clock", wall_note
        else:
            by_cpu = [cpu(DEFAULTS, rep) / cpu(f"k{i}", rep) for rep in range(reps)]
            ratio = median(by_cpu)
            against = "current defaults, CPU time per step (rank 0)"
            note = f"{spread(by_cpu)}; {wall_note}"
        rows.append(
            Row(
                "tuning",
                label,
                ratio,
                against,
                f"{median(defaults):,.0f} samples/s at the defaults",
                "",
                f"{model.describe()}, 2 processes; {note}",
            )
        )
    return rows


def bench_tuning(
    work: Path, model: CharLM, steps: int, reps: int, quick: bool, timeout: float
) -> list[Row]:
    knobs = {k: v for k, v in KNOBS.items() if not quick or k in QUICK_KNOBS}
    rows = run_knobs(work, "tuning", model, knobs, steps, reps, timeout)
    rows.append(
        not_measured(
            "tuning",
            "train.pin_memory",
            "only used with CUDA (page-locked host buffers for H2D copies); kept true",
        )
    )
    return rows


def bench_compile(work: Path, model: CharLM, steps: int, timeout: float) -> list[Row]:
    """torch.compile: one rep (compiling takes minutes on 2 cores); warm-up steps excluded."""
    return run_knobs(work, "compile", model, COMPILE, steps, 1, min(timeout, COMPILE_TIMEOUT))
