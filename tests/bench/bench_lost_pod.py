"""What a lost pod costs (issue: a lost pod costs seconds, not an epoch), and what keeping the
state in memory costs while nothing is lost.

recovery: two nodes (network namespaces, root) of two ranks each, `kubeddp train --nnodes 2`
as on bare metal, each node with its own snapshot directory (as a pod has its own memory
volume). At a random step mid-epoch either node 1 is SIGKILLed whole (its launcher and workers)
and its memory removed before it starts again, as a pod recreated on another node; or one of
node 1's workers is SIGKILLed and node 1 starts again on the same host. Node 0 stays up and
rejoins. Measured on rank 0's log: the steps of work lost (the step at the kill minus the step
training resumed at) and the seconds from the kill to the first step completed after it,
against the seconds from the cold start to the first step of the same job, for today's
defaults (no snapshots, checkpoints at epoch ends only) and for the new ones, in one run.

snapshot cost: samples per CPU-second of kubeddp with in-memory snapshots (every default) over
the same without them, in alternating pairs inside one 2-process job.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.bench.bench_trainer import CharLM, _alternate
from tests.bench.common import Row, paired
from tests.helpers import netns, procs

HOSTS = ["bench-node-0", "bench-node-1"]
KUBEDDP = str(Path(sys.executable).parent / "kubeddp")
TODAY = ("checkpoint.memory_snapshots=false", "checkpoint.every_seconds=0")
STEP = re.compile(r"^step (\d+)/", re.MULTILINE)
RESUMED = re.compile(r"resumed from (\S+) \(step (\d+)")
POLL = 0.05


# What happens between the kill and the next step, seen in the logs (node, pattern): the
# timeline says where recovery's seconds go
PHASES = (
    ("peers lost", 0, r"a peer was lost"),
    ("node 1 launcher up", 1, r"\[kubeddp\] rendezvous: "),
    ("workers up", 0, r"world size \d+ \("),
    ("state restored", 0, r"resumed from "),
)


@dataclass(frozen=True)
class Recovery:
    killed_at: int  # rank 0's newest step when the kill came
    resumed_at: int  # the step training went on from (0: from the start)
    source: str  # where from
    cold_seconds: float  # start to the first completed step
    recovery_seconds: float  # kill to the first completed step after it
    phases: dict[str, float]  # seconds after the kill each phase was first seen


def _node_argv(rank: int, work: Path, tag: str, model: CharLM, port: int,
               settings: tuple[str, ...]) -> list[str]:  # fmt: skip
    overrides = [*model.overrides(), "train.log_every=1", "train.epochs=1",
                 f"checkpoint.dir={work / f'{tag}-ckpt-{rank}'}", "metrics.port=0",
                 "network.check=off", *settings]  # fmt: skip
    argv = [KUBEDDP, "train", "--nproc", "2", "--nnodes", "2", "--node-rank", str(rank),
            "--master-addr", HOSTS[0], "--master-port", str(port)]  # fmt: skip
    for item in overrides:
        argv += ["--set", item]
    return argv


def _env(memory: Path) -> dict[str, str]:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return {**base, "PYTHONPATH": str(procs.REPO), "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1", "KUBEDDP_SNAPSHOT_DIR": str(memory)}  # fmt: skip


def _steps(text: str) -> list[int]:
    return [int(s) for s in STEP.findall(text)]


def _wait(what: str, check, timeout: float, *running: procs.Proc):  # noqa: ANN001, ANN202
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        for proc in running:
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: a node ended early\n{proc.tail(30)}")
        time.sleep(POLL)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def scenario(nodes: list[netns.Node], work: Path, tag: str, model: CharLM,
             settings: tuple[str, ...], kill: str, kill_step: int, port: int,
             timeout: float) -> Recovery:  # fmt: skip
    """One job: cold start, train to `kill_step`, lose node 1 (`kill`: pod or worker), recover."""
    memory = [work / f"{tag}-memory-{i}" for i in (0, 1)]
    argv = [_node_argv(i, work, tag, model, port, settings) for i in (0, 1)]
    start = time.monotonic()
    with procs.started(nodes[0].wrap(argv[0]), work / f"{tag}-node0.log", _env(memory[0])) as zero:
        one = procs.Proc(nodes[1].wrap(argv[1]), work / f"{tag}-node1.log", _env(memory[1]))
        try:
            _wait("first step", lambda: _steps(zero.output()), timeout, zero, one)
            cold = time.monotonic() - start
            _wait(f"step {kill_step}", lambda: max(_steps(zero.output())) >= kill_step,
                  timeout, zero, one)  # fmt: skip
            text = zero.output()
            killed_at = max(_steps(text))
            if kill == "pod":
                one.kill()
                killed = time.monotonic()
                shutil.rmtree(memory[1], ignore_errors=True)  # a pod's memory goes with it
            else:
                workers = procs.torchrun_workers(_launcher_pid(one))
                os.kill(max(workers.values()), signal.SIGKILL)
                killed = time.monotonic()
                one.wait(timeout)
            marks = (len(text), len(one.output()))  # node 1's next start appends to its log
            one = procs.Proc(nodes[1].wrap(argv[1]), work / f"{tag}-node1.log", _env(memory[1]))
            phases: dict[str, float] = {}

            def stepped_after() -> int | None:
                logs = (zero.output()[marks[0] :], one.output()[marks[1] :])
                for name, node, pattern in PHASES:
                    if name not in phases and re.search(pattern, logs[node]):
                        phases[name] = time.monotonic() - killed
                restarted = logs[0].find("world size")  # the run describes itself again
                steps = _steps(logs[0][restarted:]) if restarted >= 0 else []
                return steps[0] if steps else None

            _wait("a step after the kill", stepped_after, timeout, zero, one)
            recovered = time.monotonic() - killed
            mark = marks[0]
            resumed = RESUMED.search(zero.output()[mark:])
        finally:
            one.kill()
    source, at = (resumed.group(1), int(resumed.group(2))) if resumed else ("the start", 0)
    return Recovery(killed_at, at, source, cold, recovered, phases)


def _launcher_pid(proc: procs.Proc) -> int:
    """The `kubeddp train` process under `ip netns exec ... sh -c`: the one whose children
    are torchrun's workers."""
    for pid in [proc.pid, *procs.descendants(proc.pid)]:
        if procs.torchrun_workers(pid):
            return pid
    raise RuntimeError("no workers found under node 1")


def bench_recovery(work: Path, model: CharLM, kill_range: tuple[int, int], timeout: float,
                   seed: int = 0) -> list[Row]:  # fmt: skip
    netns.require_root()
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = []
    with netns.cluster(HOSTS) as nodes:
        for kill in ("pod", "worker"):
            step = rng.randint(*kill_range)
            results = {}
            for name, settings in (("today's defaults", TODAY), ("every default", ())):
                tag = f"{kill}-{'today' if settings else 'new'}"
                port = 29600 + len(rows) * 3 + len(results)
                results[name] = scenario(nodes, work, tag, model, settings, kill, step, port,
                                         timeout)  # fmt: skip
            for name, r in results.items():
                rows.append(_recovery_row(kill, name, r, model))
    return rows


def _recovery_row(kill: str, name: str, r: Recovery, model: CharLM) -> Row:
    lost = r.killed_at - r.resumed_at
    what = "a pod (launcher, workers, memory)" if kill == "pod" else "one worker process"
    return Row(
        "recovery",
        f"{what} SIGKILLed at step {r.killed_at}, {name}: recovery / cold start",
        r.recovery_seconds / r.cold_seconds,
        "the same job's cold start (start to first step), same run",
        f"{lost} steps lost (resumed at {r.resumed_at} from {r.source}); "
        f"{r.recovery_seconds:.1f} s from the kill to the next step, cold start "
        f"{r.cold_seconds:.1f} s; after the kill: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in r.phases.items()),
        "<= 1.5" if name == "every default" else "",
        f"{model.describe()}, 2 nodes x 2 ranks (netns)",
        {"steps_lost": lost, "killed_at": r.killed_at, "resumed_at": r.resumed_at,
         "recovery_seconds": r.recovery_seconds, "cold_seconds": r.cold_seconds,
         "phases": r.phases},
    )  # fmt: skip


def bench_snapshot_cost(work: Path, model: CharLM, steps: int, reps: int,
                        timeout: float) -> list[Row]:  # fmt: skip
    """Throughput with in-memory snapshots (every default) / without, in alternating pairs
    inside one 2-process job (rank 0's process: the snapshot writer): samples per second (what
    the auto cadence's 1% budget holds) and samples per CPU-second beside it."""
    arms = {"snapshots": [], "no-snapshots": ["checkpoint.memory_snapshots=false"]}
    runs = _alternate(work, "snapshot-cost", model, steps, reps, arms, timeout)
    per_second = {arm: [t.samples_per_second() for t in runs[arm]] for arm in arms}
    per_cpu = {arm: [t.samples_per_step / t.cpu_seconds_per_step() for t in runs[arm]]
               for arm in arms}  # fmt: skip
    chosen = re.findall(r"in-memory snapshots: every (\d+) steps \(auto[^)]*\), ([\d.]+ \w+) each",
                        (work / "snapshot-cost.log").read_text(errors="replace"))  # fmt: skip
    every = sorted(int(n) for n, _ in chosen)
    cadence = (
        f"auto cadence every {every[0]}-{every[-1]} steps, {chosen[0][1]} each" if every else ""
    )
    against = "snapshots off, alternating in one 2-process job"
    pairs = {arm: list(zip(values["snapshots"], values["no-snapshots"], strict=True))
             for arm, values in (("wall", per_second), ("cpu", per_cpu))}  # fmt: skip
    note = "; ".join(x for x in (model.describe(), cadence) if x)
    return [
        paired("recovery", "samples per second, in-memory snapshots on (auto cadence) / off",
               against, pairs["wall"], "samples/s", ">= 0.99", note),
        paired("recovery", "samples per CPU-second, in-memory snapshots on / off", against,
               pairs["cpu"], "samples per CPU-second", "", "the budget is 1% of wall time"),
    ]  # fmt: skip
