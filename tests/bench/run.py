"""Run every benchmark and write bench-results/report.md and report.json.

python -m tests.bench.run            # full: about 40-60 min on 2 cores (multinode: root)
python -m tests.bench.run --quick    # fewer repeats and knobs: a few minutes
python -m tests.bench.run --tiny     # seconds; only proves the machinery works
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.bench import bench_comm, bench_keeper, bench_multinode, bench_trainer, bench_tuning, gpu
from tests.bench.bench_trainer import CharLM, safely
from tests.bench.common import REPO_ROOT, Row, not_measured
from tests.bench.report import write_report

SECTIONS = (
    "overhead",
    "startup",
    "scaling",
    "communication",
    "multinode",
    "tuning",
    "gpu",
    "checkpoint",
    "keeper",
    "metrics",
)


@dataclass(frozen=True)
class Sizes:
    """How much each benchmark runs in one mode."""

    overhead_model: CharLM
    overhead_steps: int
    overhead_reps: int
    micro_steps: int
    ckpt_every: int
    startup_steps: int
    startup_reps: int
    compute_model: CharLM  # compute-bound: scaling, exposed communication, tuning
    scaling_steps: int
    scaling_reps: int
    comm_sizes_mb: tuple[float, ...]
    comm_iters: int
    multinode_steps: int
    multinode_reps: int
    multinode_rate: str  # the tc rate of each node's link: communication costs as much as compute
    tuning_steps: int
    tuning_reps: int
    quick_knobs: bool
    compile: bool
    timeout: float
    keeper_sizes_mib: tuple[int, ...] = (1024, 4096)  # against a TCP copy (bench_keeper.py)
    keeper_reps: int = 2
    keeper_pods_mib: int = 256


SMALL = CharLM(n_layer=2, n_embd=64, batch_size=16)
COMPUTE = CharLM(n_layer=3, n_embd=192, batch_size=8)
MICRO = CharLM(n_layer=1, n_embd=16, batch_size=2, seq_len=16)
TINY = CharLM(n_layer=1, n_embd=32, batch_size=4, seq_len=32, corpus_max_bytes=20_000)

MODES = {
    "full": Sizes(
        overhead_model=SMALL,
        overhead_steps=80,
        overhead_reps=7,
        micro_steps=200,
        ckpt_every=40,
        startup_steps=30,
        startup_reps=5,
        compute_model=COMPUTE,
        scaling_steps=40,
        scaling_reps=3,
        comm_sizes_mb=(1, 16, 64),
        comm_iters=10,
        multinode_steps=40,
        multinode_reps=5,
        multinode_rate="200mbit",
        tuning_steps=30,
        tuning_reps=2,
        quick_knobs=False,
        compile=True,
        timeout=600,
        keeper_reps=3,
    ),
    "quick": Sizes(
        overhead_model=SMALL,
        overhead_steps=40,
        overhead_reps=5,
        micro_steps=150,
        ckpt_every=20,
        startup_steps=20,
        startup_reps=1,
        compute_model=COMPUTE,
        scaling_steps=25,
        scaling_reps=1,
        comm_sizes_mb=(1, 16, 64),
        comm_iters=5,
        multinode_steps=30,
        multinode_reps=1,
        multinode_rate="200mbit",
        tuning_steps=25,
        tuning_reps=1,
        quick_knobs=True,
        compile=False,
        timeout=300,
        keeper_sizes_mib=(256, 1024),
        keeper_reps=1,
        keeper_pods_mib=128,
    ),
    "tiny": Sizes(
        overhead_model=TINY,
        overhead_steps=8,
        overhead_reps=1,
        micro_steps=8,
        ckpt_every=4,
        startup_steps=8,
        startup_reps=1,
        compute_model=TINY,
        scaling_steps=8,
        scaling_reps=1,
        comm_sizes_mb=(0.25,),
        comm_iters=2,
        multinode_steps=8,
        multinode_reps=1,
        multinode_rate="200mbit",
        tuning_steps=8,
        tuning_reps=1,
        quick_knobs=True,
        compile=False,
        timeout=120,
        keeper_sizes_mib=(16,),
        keeper_reps=1,
        keeper_pods_mib=4,
    ),
}


def external_rows(section: str, module: str, functions: list[str], tiny: bool) -> list[Row]:
    """Rows from the checkpoint/metrics engineers' benchmarks, when those modules exist."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return [not_measured(section, f, f"{module} does not exist yet") for f in functions]
    rows = []
    for name in functions:
        fn = getattr(mod, name, None)
        if fn is None:
            rows.append(not_measured(section, name, f"{module}.{name} is missing"))
        elif tiny:
            rows.append(not_measured(section, name, "not run with --tiny"))
        else:
            try:
                rows.append(row_from_dict(section, name, fn()))
            except Exception as exc:  # noqa: BLE001 - their failure must not lose our report
                rows.append(not_measured(section, name, f"failed: {type(exc).__name__}: {exc}"))
    return rows


def row_from_dict(section: str, name: str, result: dict) -> Row:
    """A result dict -> a Row: keys name/ratio/against/absolute/goal/note as in Row; any
    other keys are kept in report.json under `extra`."""
    result = {**_metrics_ratio(result), **result}
    ratio = result.get("ratio")
    known = {"ratio", "against", "absolute", "goal", "note", "name"}
    return Row(
        section,
        str(result.get("name", name)),
        float(ratio) if isinstance(ratio, (int, float)) else None,
        str(result.get("against", "")),
        str(result.get("absolute", "")),
        str(result.get("goal", "")),
        str(result.get("note", "")),
        {k: v for k, v in result.items() if k not in known},
    )


def _metrics_ratio(result: dict) -> dict:
    """bench_metrics_overhead() reports step medians with metrics on and off: as a ratio."""
    on, off = result.get("step_ms_median_metrics_on"), result.get("step_ms_median_metrics_off")
    if not (isinstance(on, (int, float)) and isinstance(off, (int, float)) and on > 0):
        return {}
    allowed = float(result.get("goal_pct", 1.0))
    return {
        "name": "step rate with Prometheus metrics on / off",
        "ratio": off / on,
        "against": "metrics off, alternating blocks of steps in the same run",
        "absolute": f"{on:.2f} vs {off:.2f} ms per step; on_step "
        f"{result.get('on_step_us_median', float('nan')):.1f} us",
        "goal": f">= {1 - allowed / 100:g}",
        "note": "regression workload, 1 CPU process: the shortest kubeddp step (worst case)",
    }


def run_all(mode: str, sections: tuple[str, ...], work: Path, log) -> list[Row]:
    s = MODES[mode]
    tiny = mode == "tiny"
    rows: list[Row] = []
    if "overhead" in sections:
        log("overhead: kubeddp Trainer vs the hand-written loop, alternating")
        rows += safely(
            "overhead",
            "training throughput, kubeddp / hand-written DDP loop",
            bench_trainer.bench_overhead,
            work,
            s.overhead_model,
            s.overhead_steps,
            s.overhead_reps,
            s.ckpt_every,
            s.timeout,
        )
        rows += safely(
            "overhead",
            "per-step fixed cost",
            bench_trainer.bench_step_cost,
            work,
            MICRO,
            s.micro_steps,
            s.overhead_reps,
            s.timeout,
        )
    if "startup" in sections:
        log("startup: kubeddp train vs torchrun baseline_ddp.py")
        rows += safely(
            "startup",
            "process start to first completed step",
            bench_trainer.bench_startup,
            work,
            s.overhead_model,
            s.startup_steps,
            s.startup_reps,
            s.timeout,
        )
    if "scaling" in sections:
        log("scaling: 1 -> 2 processes")
        rows += safely(
            "scaling",
            "2-process efficiency",
            bench_trainer.bench_scaling,
            work,
            s.compute_model,
            s.scaling_steps,
            s.scaling_reps,
            s.timeout,
        )
    if "communication" in sections:
        log("communication: all_reduce bandwidth, exposed DDP communication")
        rows += safely(
            "communication",
            "gloo all_reduce and DDP overlap",
            bench_comm.bench_comm,
            work,
            list(s.comm_sizes_mb),
            s.comm_iters,
            s.compute_model,
            max(2, s.comm_iters),
            s.timeout,
        )
    if "multinode" in sections:
        log(f"multinode: 2 network-namespace nodes, link {s.multinode_rate}, alternating arms")
        rows += safely(
            "across nodes",
            "2 nodes over a shaped link",
            bench_multinode.bench_multinode,
            work / "multinode",
            s.compute_model,
            s.multinode_steps,
            s.multinode_reps,
            s.multinode_rate,
            s.timeout,
        )
    if "tuning" in sections:
        log("tuning: DDP and DataLoader knobs")
        rows += safely(
            "tuning",
            "DDP and DataLoader knobs",
            bench_tuning.bench_tuning,
            work,
            s.compute_model,
            s.tuning_steps,
            s.tuning_reps,
            s.quick_knobs,
            s.timeout,
        )
        if s.compile:
            log("tuning: torch.compile")
            rows += safely(
                "tuning",
                "train.compile=true",
                bench_tuning.bench_compile,
                work,
                s.compute_model,
                s.tuning_steps,
                s.timeout,
            )
    if "gpu" in sections:
        if torch.cuda.is_available():
            log("gpu: charlm MFU")
            rows += gpu.bench_gpu(work, "cuda", tiny)
        else:
            log(f"gpu bench skipped: {gpu.NO_CUDA}")
            rows += [not_measured("gpu", "charlm model FLOPs utilisation", gpu.NO_CUDA)]
            if tiny:  # keep the CPU-runnable half of the GPU path from rotting
                rows += gpu.bench_gpu(work, "cpu", tiny=True)
    if "checkpoint" in sections:
        log("checkpoint: stall and recovery")
        rows += external_rows(
            "checkpoint",
            "tests.bench.bench_checkpoint",
            ["bench_checkpoint_stall", "bench_recovery"],
            tiny,
        )
    if "keeper" in sections:
        log(f"keeper: push and fetch of {s.keeper_sizes_mib} MiB against a TCP copy, 8 pods")
        rows += safely(
            "keeper",
            "checkpoint keeper",
            bench_keeper.bench_keeper,
            work,
            list(s.keeper_sizes_mib),
            s.keeper_reps,
            s.keeper_pods_mib,
        )
    if "metrics" in sections:
        log("metrics: overhead")
        rows += external_rows(
            "metrics", "tests.bench.bench_metrics", ["bench_metrics_overhead"], tiny
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="kubeddp benchmarks (ratios against baselines)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer repeats and knobs")
    size.add_argument("--tiny", action="store_true", help="tiny sizes: checks the machinery")
    p.add_argument("--out", default=str(REPO_ROOT / "bench-results"), help="report directory")
    p.add_argument("--only", default="", help=f"comma-separated sections of: {', '.join(SECTIONS)}")
    p.add_argument("--keep", default="", help="keep raw step times and logs in this directory")
    args = p.parse_args(argv)
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    sections = tuple(x.strip() for x in args.only.split(",") if x.strip()) or SECTIONS
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown:
        p.error(f"--only {','.join(unknown)}: unknown section; use {', '.join(SECTIONS)}")
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[bench {time.perf_counter() - start:5.0f}s] {msg}", flush=True)

    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        rows = run_all(mode, sections, Path(args.keep), log)
    else:
        with tempfile.TemporaryDirectory(prefix="kubeddp-bench-") as work:
            rows = run_all(mode, sections, Path(work), log)
    md, js = write_report(Path(args.out), rows, mode, time.perf_counter() - start)
    print(md.read_text())
    log(f"wrote {md} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
