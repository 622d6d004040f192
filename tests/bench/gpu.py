"""GPU bench: kubeddp vs a hand-written torchrun loop on one CUDA device (NCCL, world size 1),
eager and compiled, bf16 vs fp32, MFU against this card's measured bf16 matmul peak, peak
GPU memory and compile time, for the demo model and a GPT-2-small-sized charlm.

    python -m tests.bench.gpu [--out FILE]          # on a CUDA machine: about 4 minutes
    python -m tests.bench.gpu --device cpu --tiny   # the same path on CPU, tiny (smoke test)

The runs share a time budget (--budget): an arm that would not fit is not started and shows
as "skipped (time budget)"; one still running when the budget ends is stopped. Arms run most
important first (tests/bench/gpu_runs.py plan).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.bench.bench_trainer import CharLM
from tests.bench.common import BenchError, Row, not_measured
from tests.bench.gpu_flops import charlm_train_flops_per_token, measure_matmul_peak
from tests.bench.gpu_report import GpuReport
from tests.bench.gpu_runs import SKIPPED_BUDGET, Arm, ArmResult, BenchModel, plan, run_arm

__all__ = ["bench_gpu", "charlm_train_flops_per_token", "main", "measure_matmul_peak"]

NO_CUDA = "no CUDA device visible; run `python -m tests.bench.gpu` on a GPU machine"
DEFAULT_BUDGET_SECONDS = 220.0

# What `make demo` trains: charlm at the trainer's workload defaults (2x128, 4 heads, seq 64,
# 2 MB of stdlib text) and its default per-process batch of 32.
DEMO = BenchModel("demo", "demo 2x128 b32x64", CharLM(n_layer=2, n_embd=128, batch_size=32))
# GPT-2 small's shape (12 layers x 768, 12 heads) at seq 512. Batch 64 (32,768 tokens/step):
# on the H200's slow host the eager step of this model takes ~30 ms at batch 16 and at batch 32
# alike (kernel launches, not the GPU, set the pace: gpu-run1), so batch 64 is the smallest
# that makes the GPU the bottleneck; ~14 GiB in bf16 and ~25 GiB in fp32, far below 80 GiB.
# 6 MB of text holds 164 steps of one epoch: the runs never reach an epoch end.
GPT2_SMALL = BenchModel(
    "12x768",
    "GPT-2-small 12x768 b64x512",
    CharLM(
        n_layer=12, n_embd=768, n_head=12, seq_len=512, batch_size=64, corpus_max_bytes=6_000_000
    ),
)
TINY = BenchModel(
    "tiny",
    "tiny 1x32 b4x32",
    CharLM(n_layer=1, n_embd=32, batch_size=4, seq_len=32, corpus_max_bytes=20_000),
)


@dataclass(frozen=True)
class Sizes:
    models: tuple[BenchModel, ...]
    warmup: int  # steps before timing (compiled arms: one window more)
    measured: int  # timed steps (fp32: half)
    eager_guess: float  # seconds an eager arm takes before one has run
    compile_guess: float  # seconds compiling adds before a compiled arm has run
    no_compile: str  # why compiled arms are skipped; empty = they run
    no_fp32: str  # why fp32 arms are skipped; empty = they run


GPU_SIZES = Sizes((GPT2_SMALL, DEMO), 10, 120, 30.0, 45.0, "", "")
# CPU smoke: both trainers through their real launchers, about 10 s on 2 cores. Compiling on
# CPU takes minutes; the fp32 arm is the bf16 arm with one override changed.
TINY_SIZES = Sizes(
    (TINY,), 10, 20, 10.0, 60.0, "skipped (--tiny: no torch.compile)", "skipped (--tiny)"
)


def estimate_seconds(arm: Arm, done: list[ArmResult], sizes: Sizes) -> float:
    """What `arm` will take, judged from the runs so far: a finished run of the same model
    and mode; else an eager run (this model's, else any) plus, compiled, what compiling
    added to another model's run (else the guesses). Deliberately on the high side: an arm
    that would be stopped half-way wastes the time a cheaper arm after it could have used."""
    ok = [r for r in done if r.ok]

    def eager_wall(model: BenchModel | None) -> float | None:
        walls = [r.wall_seconds for r in ok if not r.arm.compiled and model in (None, r.arm.model)]
        return max(walls) if walls else None

    same = [
        r.wall_seconds for r in ok if r.arm.compiled == arm.compiled and r.arm.model == arm.model
    ]
    if same:
        return max(same)
    eager = eager_wall(arm.model) or eager_wall(None) or sizes.eager_guess
    if not arm.compiled:
        return eager
    added = [
        r.wall_seconds - base
        for r in ok
        if r.arm.compiled and (base := eager_wall(r.arm.model)) is not None
    ]
    return eager + (max(added) if added else sizes.compile_guess)


def run_arms(
    arms: list[Arm], device: str, work: Path, sizes: Sizes, budget: float, log
) -> tuple[list[ArmResult], float]:
    """Run the arms in order within `budget` seconds; return the results and the seconds used."""
    start = time.perf_counter()
    results: list[ArmResult] = []
    for arm in arms:
        left = budget - (time.perf_counter() - start)
        why_not = (arm.compiled and sizes.no_compile) or (arm.amp == "off" and sizes.no_fp32)
        if why_not:
            results.append(ArmResult(arm, why_not))
            continue
        guess = estimate_seconds(arm, results, sizes)
        if guess > left:
            log(f"{arm.key}: skipped, needs ~{guess:.0f} s, {left:.0f} s left")
            results.append(ArmResult(arm, SKIPPED_BUDGET))
            continue
        log(f"{arm.key}: running ({arm.steps} steps; ~{guess:.0f} s, {left:.0f} s left)")
        try:
            results.append(run_arm(arm, device, work, timeout=left))
        except BenchError as exc:
            out_of_time = budget - (time.perf_counter() - start) <= 1.0
            status = f"{SKIPPED_BUDGET}: stopped" if out_of_time else f"failed: {exc}"
            log(f"{arm.key}: {status}")
            results.append(ArmResult(arm, status))
    return results, time.perf_counter() - start


def device_line(device: torch.device) -> str:
    if device.type != "cuda":
        return f"CPU, torch {torch.__version__}"
    version = torch.cuda.nccl.version()  # a tuple (2, 28, 9); an int in old releases
    nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return (
        f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, NCCL {nccl}"
    )


def measure(
    work: Path, device_name: str, tiny: bool, budget: float, log=print, models: str = ""
) -> GpuReport:
    device = torch.device(device_name)
    sizes = TINY_SIZES if tiny else GPU_SIZES
    peak = measure_matmul_peak(
        device, torch.bfloat16, n=256 if tiny else 8192, iters=3 if tiny else 10
    )
    log(f"bf16 matmul peak {peak / 1e12:.2f} TFLOP/s")
    big, *rest = sizes.models
    arms = plan(big, rest[0] if rest else None, sizes.warmup, sizes.measured)
    if models:  # e.g. "demo": only that model's arms (a second, short GPU slot)
        arms = [arm for arm in arms if arm.model.name in models.split(",")]
    results, seconds = run_arms(arms, device.type, work, sizes, budget, log)
    return GpuReport(list(sizes.models), results, peak, device_line(device), budget, seconds)


def bench_gpu(
    work: Path, device_name: str, tiny: bool, budget: float = DEFAULT_BUDGET_SECONDS
) -> list[Row]:
    """The GPU figures as report rows (what `python -m tests.bench.run` collects)."""
    if device_name == "cuda" and not torch.cuda.is_available():
        return [not_measured("gpu", "kubeddp on one GPU", NO_CUDA)]
    report = measure(work, device_name, tiny, budget)
    print(report.table(), flush=True)
    return report.rows()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="kubeddp on one GPU: vs a hand-written loop, MFU")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="tiny model and matmul (smoke test)")
    p.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_SECONDS,
        help="seconds all runs may take together (default %(default).0f)",
    )
    p.add_argument("--models", default="", help="only these models' arms, e.g. demo or 12x768")
    p.add_argument("--out", default="", help="write the results as JSON here")
    p.add_argument("--keep", default="", help="keep each run's log and summary in this directory")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu bench skipped: {NO_CUDA}")
        return 0
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[gpu bench {time.perf_counter() - start:5.0f}s] {msg}", flush=True)

    with tempfile.TemporaryDirectory(prefix="kubeddp-bench-gpu-") as tmp:
        work = Path(args.keep or tmp)
        report = measure(work, args.device, args.tiny, args.budget, log, args.models)
    print()
    print(report.table(), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        log(f"wrote {args.out}")
    failed = [r for r in report.results if r.status.startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
