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
    median,
    not_measured,
    run_job,
    spread,
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
) -> dict[str, list[StepTimes]]:
    """Run overhead_worker.py: baseline and kubeddp arms alternating in one 2-process job."""
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
        for arm in ("baseline", *arms)
    }


def bench_overhead(
    work: Path, model: CharLM, steps: int, reps: int, ckpt_every: int, timeout: float
) -> list[Row]:
    """kubeddp's Trainer vs the hand-written loop, alternating inside one 2-process job.

    Every kubeddp arm records metrics (a real prometheus multiprocess directory). The first
    has the baseline's arithmetic (clipping off) and the default checkpointing (end of epoch,
    so none inside the measured steps); the second adds an async checkpoint every
    `ckpt_every` steps; the third runs every trainer default (adds gradient clipping)."""
    arms = {
        "kubeddp": ["train.grad_clip=0"],
        "kubeddp-ckpt": ["train.grad_clip=0", f"checkpoint.every_steps={ckpt_every}"],
        "kubeddp-defaults": [],
        "kubeddp-no-diagnostics": ["train.grad_clip=0", "diagnostics.enabled=false"],
    }
    runs = _alternate(work, "overhead", model, steps, reps, arms, timeout)
    rows = [_diagnostics_row(runs, f"{model.describe()}, 2 processes, gloo, {steps} steps")]
    base_sps = [t.samples_per_second() for t in runs["baseline"]]
    base_cpu = [t.cpu_seconds_per_step() for t in runs["baseline"]]
    what = f"{model.describe()}, 2 processes, gloo, {steps} steps per run, metrics on"
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
    }
    for arm, (name, goal, note) in labels.items():
        cpu = [t.cpu_seconds_per_step() for t in runs[arm]]
        ratios = [b / k for k, b in zip(cpu, base_cpu, strict=True)]
        rows.append(
            Row(
                "overhead",
                f"samples per CPU-second, {name}",
                median(ratios),
                "baseline_ddp.py loop, same processes, alternating",
                f"{median(cpu) * 1000:.2f} vs {median(base_cpu) * 1000:.2f} CPU-ms per step",
                goal,
                f"{note}; {spread(ratios)}",
            )
        )
    for arm, (name, _, _) in labels.items():
        sps = [t.samples_per_second() for t in runs[arm]]
        ratios = [k / b for k, b in zip(sps, base_sps, strict=True)]
        rows.append(
            Row(
                "overhead",
                f"wall-clock samples/s, {name}",
                median(ratios),
                "baseline_ddp.py loop, same processes, alternating",
                f"{median(sps):,.0f} vs {median(base_sps):,.0f} samples/s",
                "",
                f"includes waits for cores that other jobs hold; {spread(ratios)}",
            )
        )
    return rows


def _diagnostics_row(runs: dict[str, list[StepTimes]], what: str) -> Row:
    """Diagnostics on (heartbeat, collective counts, straggler gather at log steps, the
    divergence check) over off, in the same processes, alternating."""
    on = [t.cpu_seconds_per_step() for t in runs["kubeddp"]]
    off = [t.cpu_seconds_per_step() for t in runs["kubeddp-no-diagnostics"]]
    ratios = [b / a for a, b in zip(on, off, strict=True)]
    return Row(
        "overhead",
        "samples per CPU-second, diagnostics on / off",
        median(ratios),
        "the same Trainer with diagnostics.enabled=false, same processes, alternating",
        f"{median(on) * 1000:.2f} vs {median(off) * 1000:.2f} CPU-ms per step",
        ">= 0.99",
        f"{what}; {spread(ratios)}",
    )


def bench_step_cost(work: Path, model: CharLM, steps: int, reps: int, timeout: float) -> list[Row]:
    """A model so small that the loop's own per-step work dominates: CPU time per step,
    kubeddp over baseline, and the difference in ms (checkpoints off, metrics on)."""
    arms = {"kubeddp": ["train.grad_clip=0"], "kubeddp-defaults": []}
    runs = _alternate(work, "stepcost", model, steps, reps, arms, timeout)
    step = {arm: [t.cpu_seconds_per_step() for t in times] for arm, times in runs.items()}
    ratios = [k / b for k, b in zip(step["kubeddp"], step["baseline"], strict=True)]
    extra_ms = [(k - b) * 1000 for k, b in zip(step["kubeddp"], step["baseline"], strict=True)]
    return [
        Row(
            "overhead",
            "CPU time per step on a tiny model, kubeddp / hand-written loop",
            median(ratios),
            "baseline_ddp.py loop, same processes, alternating",
            f"{median(step['kubeddp']) * 1000:.2f} vs {median(step['baseline']) * 1000:.2f} "
            f"CPU-ms ({median(extra_ms):+.2f} ms per step)",
            "",
            f"{model.describe()}, 2 processes: the fixed per-step cost of kubeddp's loop "
            f"(stop-flag all_reduce, metrics, logging); {spread(ratios)}",
        )
    ]


def bench_startup(work: Path, model: CharLM, steps: int, reps: int, timeout: float) -> list[Row]:
    """`kubeddp train --nproc 2` vs `torchrun baseline_ddp.py`, separate launches, alternating:
    time from process start to the first completed step, and whole-run throughput."""
    extra = ["train.grad_clip=0", "train.eval_batches=1"]
    startup, throughput, start_k, start_b = [], [], [], []
    for rep in range(reps):
        got = {}
        for side in ("base", "kube") if rep % 2 == 0 else ("kube", "base"):
            tag = f"startup-{side}-{rep}"
            if side == "base":
                got[side] = run_baseline(work, tag, 2, model, steps, timeout)
            else:
                got[side] = run_kubeddp(work, tag, 2, model, steps, extra, timeout)
        (k_times, k_start), (b_times, b_start) = got["kube"], got["base"]
        start_k.append(k_start)
        start_b.append(b_start)
        startup.append(k_start / b_start)
        throughput.append(k_times.samples_per_second() / b_times.samples_per_second())
    return [
        Row(
            "startup",
            "process start to first completed step, kubeddp train / torchrun baseline",
            median(startup),
            "torchrun --standalone baseline_ddp.py",
            f"{median(start_k):.1f} s vs {median(start_b):.1f} s",
            "",
            f"2 processes, {model.describe()}; {spread(startup)}",
        ),
        Row(
            "startup",
            "throughput of the same separate launches, kubeddp / baseline",
            median(throughput),
            "torchrun --standalone baseline_ddp.py",
            "",
            "",
            f"noisier than the alternating row above (launches minutes apart); "
            f"{spread(throughput)}",
        ),
    ]


def bench_scaling(work: Path, model: CharLM, steps: int, reps: int, timeout: float) -> list[Row]:
    """1 -> 2 processes, one intra-op thread each: the 2-process run uses exactly twice the
    cores, so the ideal is 2x samples/s (per-process batch fixed, as DDP users scale)."""
    efficiencies, one, two, cpu_eff = [], [], [], []
    for rep in range(reps):
        runs = {}
        for nproc in (1, 2) if rep % 2 == 0 else (2, 1):
            tag = f"scaling-{nproc}p-{rep}"
            runs[nproc] = run_kubeddp(work, tag, nproc, model, steps, [], timeout)[0]
        one.append(runs[1].samples_per_second())
        two.append(runs[2].samples_per_second())
        efficiencies.append(two[-1] / (2 * one[-1]))
        cpu_eff.append(runs[1].cpu_seconds_per_step() / runs[2].cpu_seconds_per_step())
    what = f"{model.describe()} per process, 1 thread per process (1 vs 2 cores)"
    return [
        Row(
            "scaling",
            "2-process throughput / (2 x 1-process throughput)",
            median(efficiencies),
            "ideal linear scaling from the 1-process run",
            f"{median(two):,.0f} vs {median(one):,.0f} samples/s",
            "",
            f"{what}; wall clock; {spread(efficiencies)}",
        ),
        Row(
            "scaling",
            "CPU per step and process, 1-process / 2-process",
            median(cpu_eff),
            "the 1-process run's CPU time per step (rank 0)",
            "",
            "",
            f"{what}; the CPU work DDP adds (gradient sync, bucket copies), blind to waiting: "
            f"the efficiency an idle machine could reach; {spread(cpu_eff)}",
        ),
    ]


def safely(section: str, name: str, fn, *args) -> list[Row]:
    """A failed benchmark becomes a 'not measured' row naming the error; the rest still run."""
    try:
        return fn(*args)
    except BenchError as exc:
        return [not_measured(section, name, f"failed: {exc}")]
