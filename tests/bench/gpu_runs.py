"""The GPU bench's runs: which arms, in which order, how each one is launched and timed.

An arm is one training process on one device: `kubeddp train --nproc 1` (every default on,
through the real launcher) or `torchrun --nproc-per-node 1 baseline_ddp.py` (the hand-written
loop), on one model, eager or compiled, bf16 autocast or fp32. Each writes its per-step end
times (and, where it can, its peak GPU memory) to a summary file; only steady-state steps
are timed: warm-up steps (allocator, DDP's bucket rebuild, compilation) are skipped and the
rest is cut into windows whose median is reported, so one stall does not move the figure.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.bench.bench_trainer import CharLM
from tests.bench.common import (
    BENCH_DIR,
    BenchError,
    bench_env,
    kubeddp_cmd,
    run_job,
    torchrun_cmd,
)

KUBEDDP = "kubeddp"
HAND = "hand-written"
# The env var kubeddp's rank 0 writes step times to (trainer constants.ENV_SUMMARY_FILE);
# spelled out so this bench does not depend on where the trainer keeps its constants.
SUMMARY_ENV = "KUBEDDP_SUMMARY_FILE"
# Steps per timing window; the hand-written loop reads the loss (a host sync) every this many
# steps on CUDA, so every window starts and ends at a synced step.
WINDOW = 10
SKIPPED_BUDGET = "skipped (time budget)"


@dataclass(frozen=True)
class BenchModel:
    name: str  # short key: "12x768", "demo"
    title: str  # what the table says
    charlm: CharLM


@dataclass(frozen=True)
class Arm:
    model: BenchModel
    trainer: str  # KUBEDDP | HAND
    compiled: bool
    amp: str  # "bf16" | "off" (fp32)
    warmup: int  # steps skipped before timing; a multiple of WINDOW
    measured: int  # steps timed; a multiple of WINDOW

    @property
    def key(self) -> str:
        return f"{self.model.name}:{self.trainer}:{self.mode}:{self.precision}"

    @property
    def mode(self) -> str:
        return "compiled" if self.compiled else "eager"

    @property
    def precision(self) -> str:
        return "bf16" if self.amp == "bf16" else "fp32"

    @property
    def steps(self) -> int:
        return self.warmup + self.measured

    def label(self) -> str:
        return f"{self.trainer}, {self.mode}, {self.precision}"


@dataclass
class ArmResult:
    arm: Arm
    status: str  # "ok", SKIPPED_BUDGET, "skipped (...)" or "failed: ..."
    start_unix: float = 0.0
    wall_seconds: float = 0.0  # launch to exit
    step_end_unix: list[float] = field(default_factory=list)
    tokens_per_step: int = 0
    max_memory_bytes: int | None = None  # None: the run did not report it
    window_tokens_per_s: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(self.window_tokens_per_s)

    @property
    def step_ms(self) -> float:
        return 1000.0 * self.tokens_per_step / self.tokens_per_s

    def seconds_to_step(self, step: int) -> float:
        """Seconds from launch to the end of optimizer step `step` (1-based)."""
        return self.step_end_unix[step - 1] - self.start_unix

    def to_dict(self) -> dict:
        out = {
            "key": self.arm.key,
            "model": self.arm.model.title,
            "run": self.arm.label(),
            "status": self.status,
            "wall_seconds": round(self.wall_seconds, 2),
        }
        if self.ok:
            out |= {
                "tokens_per_s": self.tokens_per_s,
                "step_ms": self.step_ms,
                "window_tokens_per_s": self.window_tokens_per_s,
                "warmup_steps": self.arm.warmup,
                "seconds_to_first_timed_step": self.seconds_to_step(self.arm.warmup),
                "max_memory_allocated_bytes": self.max_memory_bytes,
            }
        return out


def plan(big: BenchModel, demo: BenchModel | None, warmup: int, measured: int) -> list[Arm]:
    """Every arm, most important first, so a time budget that runs out cuts the least
    important: on the big model kubeddp vs the hand-written loop (eager, bf16), bf16 vs fp32,
    then both compiled; then the demo model, whose fp32 arm comes last (a model this small
    is bound by kernel launches, so bf16 vs fp32 says little there). Compiled arms get one
    more window of warm-up: compilation happens in the first step and DDP's first steps may
    re-trace."""

    def arm(model: BenchModel, trainer: str, compiled: bool, amp: str = "bf16") -> Arm:
        # fp32 steps take several times longer (no tensor cores unless TF32 is on): a quarter
        # of the windows keeps the arm's run time near the others'.
        steps = measured if amp == "bf16" else max(2 * WINDOW, measured // 4 // WINDOW * WINDOW)
        return Arm(model, trainer, compiled, amp, warmup + WINDOW * compiled, steps)

    arms = [
        arm(big, HAND, False),
        arm(big, KUBEDDP, False),
        arm(big, KUBEDDP, False, "off"),
        arm(big, KUBEDDP, True),
        arm(big, HAND, True),
    ]
    if demo:
        arms += [
            arm(demo, HAND, False),
            arm(demo, KUBEDDP, False),
            arm(demo, KUBEDDP, True),
            arm(demo, HAND, True),
            arm(demo, KUBEDDP, False, "off"),
        ]
    return arms


def steady_windows(step_end_unix: list[float], warmup: int, tokens_per_step: int) -> list[float]:
    """Tokens/s of each WINDOW-step window after `warmup` steps (window edges: steps
    warmup, warmup+WINDOW, ...; the hand-written loop synced at each of them)."""
    edges = step_end_unix[warmup - 1 :: WINDOW]
    return [
        WINDOW * tokens_per_step / (end - begin)
        for begin, end in zip(edges, edges[1:], strict=False)
        if end > begin
    ]


def _command(arm: Arm, device: str, summary: Path, work: Path) -> list[str]:
    m = arm.model.charlm
    if arm.trainer == HAND:
        args = [
            f"--steps={arm.steps}",
            f"--summary-file={summary}",
            f"--device={device}",
            f"--amp={arm.amp}",
            f"--sync-every={WINDOW}",
            *m.baseline_args(),
            *(["--compile"] if arm.compiled else []),
        ]
        return torchrun_cmd(1, BENCH_DIR / "baseline_ddp.py", args)
    overrides = [
        *m.overrides(),
        f"train.max_steps={arm.steps}",
        f"checkpoint.dir={work / 'ckpt'}",
        "checkpoint.resume=never",
        "metrics.port=0",
        f"ddp.device={device}",
        f"train.amp='{arm.amp}'",  # quoted: YAML reads a bare `off` as false
        *(["train.compile=true"] if arm.compiled else []),
    ]
    return kubeddp_cmd(1, overrides)


def _env(arm: Arm, device: str, work: Path, summary: Path) -> dict[str, str]:
    env = bench_env(extra={SUMMARY_ENV: str(summary)})
    if device == "cuda":
        # One process per GPU: torch's own thread default, as a user's run has (bench_env
        # pins one thread per process for the CPU benches, where processes share cores).
        env.pop("OMP_NUM_THREADS", None)
        env.pop("MKL_NUM_THREADS", None)
    if arm.compiled:
        # A cold compile cache per arm: the compile time is what a first run pays, and
        # neither trainer profits from kernels the other one compiled.
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")
    return env


def run_arm(arm: Arm, device: str, work: Path, timeout: float) -> ArmResult:
    """Launch one arm and time its steady-state steps; BenchError if it fails."""
    work = work / arm.key.replace(":", "-")
    work.mkdir(parents=True, exist_ok=True)
    summary = work / "summary.json"
    cmd = _command(arm, device, summary, work)
    start = run_job(cmd, _env(arm, device, work, summary), work / "run.log", timeout)
    wall = time.time() - start
    shutil.rmtree(work / "ckpt", ignore_errors=True)  # kubeddp's final save: ~1 GB at 12x768
    if not summary.exists():
        raise BenchError(f"{arm.key}: no summary file {summary}; log {work / 'run.log'}")
    data = json.loads(summary.read_text())
    step_ends = data["step_end_unix"]
    if len(step_ends) < arm.steps:
        raise BenchError(
            f"{arm.key}: {len(step_ends)} of {arm.steps} steps recorded (an epoch shorter "
            "than the run? raise the model's corpus_max_bytes)"
        )
    tokens_per_step = data["samples_per_step"] * data["tokens_per_sample"]
    return ArmResult(
        arm,
        "ok",
        start_unix=start,
        wall_seconds=wall,
        step_end_unix=step_ends,
        tokens_per_step=tokens_per_step,
        max_memory_bytes=data.get("max_memory_allocated"),
        window_tokens_per_s=steady_windows(step_ends, arm.warmup, tokens_per_step),
    )
