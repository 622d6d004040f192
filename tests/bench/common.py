"""Shared bench machinery: run a job with a hard timeout, read step times, compute ratios."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kubeddp.trainer import constants

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parent
PYTHON = sys.executable


class BenchError(RuntimeError):
    """A benchmark job failed; the message names the command and where its log is."""


@dataclass
class Row:
    """One line of the report. `ratio` is always against `against`, measured in the same run."""

    section: str
    name: str
    ratio: float | None
    against: str
    absolute: str = ""
    goal: str = ""
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.ratio is None:
            return "not measured"
        if not self.goal:
            return ""
        op, _, number = self.goal.partition(" ")
        target = float(number)
        ok = self.ratio >= target if op == ">=" else self.ratio <= target
        return "meets goal" if ok else "MISSES goal"

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status}


def number(value: float) -> str:
    """Four significant digits, thousands separated: what the report prints of a value."""
    return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def paired(
    section: str,
    name: str,
    against: str,
    pairs: list[tuple[float, float]],
    unit: str,
    goal: str = "",
    note: str = "",
) -> Row:
    """A row from alternating pairs (this arm's value, the baseline's): its ratio is the
    median pair's own quotient (the lower middle one for an even count), and its absolute
    column shows that pair's two values, so ratio and absolute always agree; the range of the
    quotients over every pair goes in the note."""
    if not pairs:
        raise BenchError(f"{name}: no pairs measured")
    ratios = [a / b for a, b in pairs]
    middle = statistics.median_low(ratios)
    a, b = pairs[ratios.index(middle)]
    return Row(
        section,
        name,
        middle,
        against,
        f"{number(a)} vs {number(b)} {unit} (the median pair)",
        goal,
        "; ".join(x for x in (note, spread(ratios, "pairs")) if x),
        {"pair": [a, b], "pairs": [list(p) for p in pairs], "ratios": ratios},
    )


def not_measured(section: str, name: str, why: str) -> Row:
    return Row(section, name, None, "", note=why)


def bench_env(threads: int = 1, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Same thread settings for kubeddp and every baseline: one intra-op thread per process
    unless a benchmark says otherwise, so two processes on two cores do not oversubscribe."""
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "PYTHONUNBUFFERED": "1",
            "TORCHELASTIC_ERROR_FILE": "",
        }
    )
    env.pop(constants.ENV_SUMMARY_FILE, None)
    env.update(extra or {})
    return env


def run_job(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> float:
    """Run `cmd` in its own process group; return its start time (time.time()).

    On timeout or failure the whole group is killed, and BenchError names the log file."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        start = time.time()
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None or rc is None:
                _kill_group(proc)
    if rc != 0:
        why = f"timed out after {timeout:.0f}s" if rc is None else f"exit code {rc}"
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise BenchError(f"{' '.join(cmd[:6])} ... {why}; log {log}: " + " | ".join(tail))
    return start


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def torchrun_cmd(nproc: int, script: Path, args: list[str]) -> list[str]:
    return [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(script),
        *args,
    ]


def kubeddp_cmd(nproc: int, overrides: list[str]) -> list[str]:
    cmd = [PYTHON, "-m", "kubeddp", "train", "--nproc", str(nproc)]
    for item in overrides:
        cmd += ["--set", item]
    return cmd


@dataclass
class StepTimes:
    """What rank 0 wrote to $KUBEDDP_SUMMARY_FILE (kubeddp and the baseline write the same)."""

    samples_per_step: int
    tokens_per_sample: int
    step_end_unix: list[float]
    step_end_cpu: list[float]  # rank 0's process CPU time (all threads) at each step end

    @classmethod
    def read(cls, path: Path) -> StepTimes:
        data = json.loads(path.read_text())
        return cls(
            data["samples_per_step"],
            data["tokens_per_sample"],
            data["step_end_unix"],
            data.get("step_end_cpu", []),
        )

    def warmup_steps(self) -> int:
        """Steps excluded from throughput: the first 20% (at least 2): allocator, DDP's first
        bucket rebuild and lazy inits all happen there."""
        return max(2, len(self.step_end_unix) // 5)

    def samples_per_second(self) -> float:
        times = self.step_end_unix
        skip = self.warmup_steps()
        if len(times) - skip < 2:
            raise BenchError(f"only {len(times)} steps recorded; need more than {skip + 1}")
        return (len(times) - skip) * self.samples_per_step / (times[-1] - times[skip - 1])

    def cpu_seconds_per_step(self) -> float:
        """CPU time the process spent per step after warm-up. Unlike wall-clock time it does
        not grow while other jobs on a shared machine hold the cores, and it still counts
        everything the loop adds (bookkeeping, metrics, the checkpoint writer thread)."""
        cpu = self.step_end_cpu
        skip = self.warmup_steps()
        if len(cpu) - skip < 1:
            raise BenchError(f"only {len(cpu)} CPU-time samples recorded; need {skip + 1}")
        return (cpu[-1] - cpu[skip - 1]) / (len(cpu) - skip)

    def median_step_seconds(self) -> float:
        """Typical step-to-step time after warm-up: blind to rare stalls and load bursts."""
        times = self.step_end_unix[self.warmup_steps() - 1 :]
        return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], what: str = "runs") -> str:
    """Min–max of repeated ratios, so a reader sees the noise next to the median."""
    if len(values) < 2:
        return f"1 {what.rstrip('s')}"
    return f"{len(values)} {what}, {min(values):.3f}–{max(values):.3f}"
