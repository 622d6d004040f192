"""Trainer overhead, start-up time and 1 -> 2 process scaling, all through `kubeddp train`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kubeddp.trainer import constants, process_contract
from kubeddp.trainer.process_contract import ENV_DIAG_DIR
from tests.bench.common import (
    BENCH_DIR,
    BenchError,
    Row,
    StepTimes,
    bench_env,
    kubeddp_cmd,
    not_measured,
    paired,
    run_job,
    torchrun_cmd,
)


@dataclass(frozen=True)
class CharLM:
    """One charlm size, expressed both as kubeddp overrides and as baseline_ddp.py flags."""

    n_layer: int
    n_embd: int
    batch_size: int
    seq_len: int = 64
    n_head: int = 4
    corpus_max_bytes: int = 2_000_000

    def overrides(self) -> list[str]:
        return [
            f"workload.n_layer={self.n_layer}",
            f"workload.n_head={self.n_head}",
            f"workload.n_embd={self.n_embd}",
            f"workload.seq_len={self.seq_len}",
            f"workload.corpus_max_bytes={self.corpus_max_bytes}",
            f"train.batch_size={self.batch_size}",
        ]

    def baseline_args(self) -> list[str]:
        return [
            f"--n-layer={self.n_layer}",
            f"--n-head={self.n_head}",
            f"--n-embd={self.n_embd}",
            f"--seq-len={self.seq_len}",
            f"--corpus-max-bytes={self.corpus_max_bytes}",
            f"--batch-size={self.batch_size}",
        ]

    def describe(self) -> str:
        return f"charlm {self.n_layer}x{self.n_embd}, batch {self.batch_size}x{self.seq_len}"


def run_kubeddp(
    work: Path, tag: str, nproc: int, model: CharLM, steps: int, extra: list[str], timeout: float
) -> tuple[StepTimes, float]:
    """One `kubeddp train` run; returns its step times and seconds from launch to step 1."""
    summary = work / f"{tag}.json"
    overrides = [
        *model.overrides(),
        f"train.max_steps={steps}",
        f"checkpoint.dir={work / (tag + '-ckpt')}",
        "checkpoint.resume=never",
        "metrics.port=0",
        *extra,
    ]
    env = bench_env(extra={constants.ENV_SUMMARY_FILE: str(summary)})
    start = run_job(kubeddp_cmd(nproc, overrides), env, work / f"{tag}.log", timeout)
    times = StepTimes.read(summary)
    return times, times.step_end_unix[0] - start


def run_baseline(
    work: Path, tag: str, nproc: int, model: CharLM, steps: int, timeout: float
) -> tuple[StepTimes, float]:
    summary = work / f"{tag}.json"
    args = [f"--steps={steps}", f"--summary-file={summary}", *model.baseline_args()]
    cmd = torchrun_cmd(nproc, BENCH_DIR / "baseline_ddp.py", args)
    start = run_job(cmd, bench_env(), work / f"{tag}.log", timeout)
    times = StepTimes.read(summary)
    return times, times.step_end_unix[0] - start


def _alternate(
    work: Path,
    tag: str,
    model: CharLM,
    steps: int,
    reps: int,
    arms: dict[str, list[str]],
    timeout: float,
    baselines: dict[str, str] | None = None,
) -> dict[str, list[StepTimes]]:
    """Run overhead_worker.py: hand-written loop arms (`baselines`: {arm: AdamW kernel}; the
    fused one, as kubeddp picks, by default) and kubeddp arms alternating in one 2-process
    job."""
    baselines = baselines or {BASELINE: "fused"}
    out = work / tag
    out.mkdir(parents=True, exist_ok=True)
    prom = work / f"{tag}-prometheus"
    prom.mkdir(exist_ok=True)
    base = [
        *model.overrides(),
        f"train.max_steps={steps}",
        "train.eval_batches=1",
        "checkpoint.resume=never",
        "metrics.port=0",
    ]
    args = [
        f"--out-dir={out}",
        f"--reps={reps}",
        f"--steps={steps}",
        "--base=" + json.dumps(base),
        "--arms=" + json.dumps(arms),
        "--baselines=" + json.dumps(baselines),
    ]
    diag = work / f"{tag}-diagnostics"  # heartbeat records, as kubeddp launch makes them
    diag.mkdir(exist_ok=True)
    env = bench_env(
        extra={process_contract.ENV_PROMETHEUS_MULTIPROC_DIR: str(prom), ENV_DIAG_DIR: str(diag)}
    )
    cmd = torchrun_cmd(2, BENCH_DIR / "overhead_worker.py", args)
    run_job(cmd, env, work / f"{tag}.log", timeout)
    return {
        arm: [StepTimes.read(out / f"{arm}-{r}.json") for r in range(reps)]
        for arm in (*baselines, *arms)
    }


BASELINE = "baseline"
LOOP = "baseline_ddp.py loop (fused AdamW, as kubeddp), same processes, alternating"


def per_cpu_second(times: StepTimes) -> float:
    """Samples per CPU-second of rank 0 (all its threads) after warm-up."""
    return times.samples_per_step / times.cpu_seconds_per_step()


def _pairs(runs: dict[str, list[StepTimes]], arm: str, base: str, of) -> list[tuple[float, float]]:  # noqa: ANN001
    return [(of(a), of(b)) for a, b in zip(runs[arm], runs[base], strict=True)]


def bench_overhead(
    work: Path, model: CharLM, steps: int, reps: int, ckpt_every: int, timeout: float
) -> list[Row]:
    """kubeddp's Trainer vs the hand-written loop, alternating inside one 2-process job.

    Every kubeddp arm records metrics (a real prometheus multiprocess directory). The first
    has the baseline's arithmetic (clipping off) and the default checkpointing (end of epoch,
    so none inside the measured steps); the second adds an async checkpoint every
    `ckpt_every` steps; the third runs every trainer default (adds gradient clipping). The
    loop runs with the AdamW kernel kubeddp picks (fused) and, for context, with torch's
    default kernel (what the tutorial's `AdamW(params, lr)` gets). Every ratio is the median
    of `reps` alternating pairs, in samples per CPU-second and in wall-clock samples/s."""
    arms = {
        "kubeddp": ["train.grad_clip=0"],
        "kubeddp-ckpt": ["train.grad_clip=0", f"checkpoint.every_steps={ckpt_every}"],
        "kubeddp-defaults": [],
        "kubeddp-no-diagnostics": ["train.grad_clip=0", "diagnostics.enabled=false"],
    }
    baselines = {BASELINE: "fused", "baseline-adamw-default": "default"}
    runs = _alternate(work, "overhead", model, steps, reps, arms, timeout, baselines)
    what = f"{model.describe()}, 2 processes, gloo, {steps} steps per run, metrics on"
    rows = [_diagnostics_row(runs, what)]
    labels = {
        "kubeddp": ("kubeddp / hand-written DDP loop", ">= 0.98", f"{what}; clipping off"),
        "kubeddp-ckpt": (
            f"kubeddp with an async checkpoint every {ckpt_every} steps / hand-written loop",
            "",
            "one save inside the measured steps: far more often than a real job saves",
        ),
        "kubeddp-defaults": (
            "kubeddp, every default (adds grad_clip=1) / hand-written loop",
            "",
            "the gap to the first row is what gradient clipping costs",
        ),
        "baseline-adamw-default": (
            "hand-written loop with torch's default AdamW / with fused AdamW",
            "",
            "context: what the optimizer kernel alone is worth on this model",
        ),
    }
    for arm, (name, goal, note) in labels.items():
        rows.append(paired("overhead", f"samples per CPU-second, {name}", LOOP,
                           _pairs(runs, arm, BASELINE, per_cpu_second),
                           "samples per CPU-second", goal, note))  # fmt: skip
    for arm, (name, _, _) in labels.items():
        rows.append(paired("overhead", f"wall-clock samples/s, {name}", LOOP,
                           _pairs(runs, arm, BASELINE, StepTimes.samples_per_second),
                           "samples/s", "",
                           "includes waits for cores that other jobs hold"))  # fmt: skip
    return rows


def _diagnostics_row(runs: dict[str, list[StepTimes]], what: str) -> Row:
    """Diagnostics on (heartbeat, collective counts, straggler gather at log steps, the
    divergence check) over off, in the same processes, alternating."""
    return paired(
        "overhead",
        "samples per CPU-second, diagnostics on / off",
        "the same Trainer with diagnostics.enabled=false, same processes, alternating",
        _pairs(runs, "kubeddp", "kubeddp-no-diagnostics", per_cpu_second),
        "samples per CPU-second",
        ">= 0.99",
        what,
    )


def bench_step_cost(work: Path, model: CharLM, steps: int, reps: int, timeout: float) -> list[Row]:
    """A model so small that the loop's own per-step work dominates: CPU time per step,
    kubeddp over baseline (checkpoints off, metrics on)."""
    arms = {"kubeddp": ["train.grad_clip=0"], "kubeddp-defaults": []}
    runs = _alternate(work, "stepcost", model, steps, reps, arms, timeout)

    def cpu_ms(times: StepTimes) -> float:
        return times.cpu_seconds_per_step() * 1000

    return [
        paired(
            "overhead",
            "CPU time per step on a tiny model, kubeddp / hand-written loop",
            LOOP,
            _pairs(runs, "kubeddp", BASELINE, cpu_ms),
            "CPU-ms per step",
            "",
            f"{model.describe()}, 2 processes: the fixed per-step cost of kubeddp's loop "
            "(stop-flag all_reduce, metrics, logging); lower is cheaper",
        )
    ]


def bench_startup(work: Path, model: CharLM, steps: int, reps: int, timeout: float) -> list[Row]:
    """`kubeddp train --nproc 2` vs `torchrun baseline_ddp.py`, separate launches, alternating:
    time from process start to the first completed step, and whole-run throughput."""
    extra = ["train.grad_clip=0", "train.eval_batches=1"]
    startup, throughput = [], []
    for rep in range(reps):
        got = {}
        for side in ("base", "kube") if rep % 2 == 0 else ("kube", "base"):
            tag = f"startup-{side}-{rep}"
            if side == "base":
                got[side] = run_baseline(work, tag, 2, model, steps, timeout)
            else:
                got[side] = run_kubeddp(work, tag, 2, model, steps, extra, timeout)
        (k_times, k_start), (b_times, b_start) = got["kube"], got["base"]
        startup.append((k_start, b_start))
        throughput.append((k_times.samples_per_second(), b_times.samples_per_second()))
    against = "torchrun --standalone baseline_ddp.py, separate launches, alternating"
    return [
        paired("startup", "process start to first completed step, kubeddp train / torchrun "
               "baseline", against, startup, "s", "",
               f"2 processes, {model.describe()}; lower is faster"),
        paired("startup", "throughput of the same separate launches, kubeddp / baseline",
               against, throughput, "samples/s", "",
               "noisier than the alternating rows of the overhead section (launches minutes "
               "apart)"),
    ]  # fmt: skip


def bench_scaling(work: Path, model: CharLM, steps: int, reps: int, timeout: float) -> list[Row]:
    """1 -> 2 processes, one intra-op thread each: the 2-process run uses exactly twice the
    cores, so the ideal is 2x samples/s (per-process batch fixed, as DDP users scale)."""
    efficiency, cpu = [], []
    for rep in range(reps):
        runs = {}
        for nproc in (1, 2) if rep % 2 == 0 else (2, 1):
            tag = f"scaling-{nproc}p-{rep}"
            runs[nproc] = run_kubeddp(work, tag, nproc, model, steps, [], timeout)[0]
        efficiency.append((runs[2].samples_per_second(), 2 * runs[1].samples_per_second()))
        cpu.append((runs[1].cpu_seconds_per_step() * 1000, runs[2].cpu_seconds_per_step() * 1000))
    what = f"{model.describe()} per process, 1 thread per process (1 vs 2 cores)"
    return [
        paired("scaling", "2-process throughput / (2 x 1-process throughput)",
               "ideal linear scaling from the 1-process run (twice its samples/s)", efficiency,
               "samples/s", "", f"{what}; wall clock"),
        paired("scaling", "CPU per step and process, 1-process / 2-process",
               "the 1-process run's CPU time per step (rank 0)", cpu, "CPU-ms per step", "",
               f"{what}; the CPU work DDP adds (gradient sync, bucket copies), blind to "
               "waiting: the efficiency an idle machine could reach"),
    ]  # fmt: skip


def safely(section: str, name: str, fn, *args) -> list[Row]:
    """A failed benchmark becomes a 'not measured' row naming the error; the rest still run."""
    try:
        return fn(*args)
    except BenchError as exc:
        return [not_measured(section, name, f"failed: {exc}")]
