"""Across nodes: two network-namespace nodes, one process each, the link between them shaped by
`tc` (tbf on each node's eth0) to a rate where the gradient all-reduce costs as much as the
compute of a step. In one run, alternating arm after arm:

- kubeddp with its defaults (the network check included, before the first step) vs the
  hand-written loop (tests/bench/baseline_ddp.py, with the AdamW kernel kubeddp picks) on the
  same link: goal >= 1.0;
- kubeddp with each gradient compression hook (bf16, PowerSGD) vs the same loop: reported;
- each vs twice its own one-node, one-process throughput: the scaling efficiency.

Needs root (network namespaces); elsewhere its rows say why they were not measured.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from pathlib import Path

from kubeddp.trainer import constants
from tests.bench.bench_trainer import CharLM, per_cpu_second
from tests.bench.common import (
    BENCH_DIR,
    PYTHON,
    REPO_ROOT,
    BenchError,
    Row,
    StepTimes,
    bench_env,
    median,
    not_measured,
    paired,
)
from tests.helpers.ports import free_port

HOSTS = ["bench-node-0", "bench-node-1"]
HOOKS = ("bf16", "powersgd")
SECTION = "across nodes"


def _kubeddp(rank: int, nodes: int, master: str, port: int, overrides: list[str]) -> list[str]:
    cmd = [PYTHON, "-m", "kubeddp", "train", "--nproc", "1"]
    if nodes > 1:
        cmd += ["--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", master,
                "--master-port", str(port)]  # fmt: skip
    for item in overrides:
        cmd += ["--set", item]
    return cmd


def _baseline(rank: int, nodes: int, master: str, port: int, args: list[str]) -> list[str]:
    rdzv = ["--standalone"]
    if nodes > 1:
        rdzv = ["--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", master,
                "--master-port", str(port)]  # fmt: skip
    return [PYTHON, "-m", "torch.distributed.run", *rdzv, "--nproc-per-node=1",
            str(BENCH_DIR / "baseline_ddp.py"), *args]  # fmt: skip


def _run_nodes(
    nodes: list, commands: list[list[str]], env: dict, log: Path, timeout: float
) -> None:
    """One command per node, at once; all must exit 0 within `timeout` (else every one is
    killed, with all it started, and BenchError names the log)."""
    procs = []
    with contextlib.ExitStack() as stack:
        for i, (node, cmd) in enumerate(zip(nodes, commands, strict=False)):
            out = stack.enter_context(log.with_suffix(f".node{i}.log").open("w"))
            procs.append(subprocess.Popen(
                node.wrap(cmd), env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            ))  # fmt: skip
        deadline = time.monotonic() + timeout
        codes = []
        try:
            for p in procs:
                codes.append(p.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
        finally:
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, 9)
                    p.wait()
    if codes != [0] * len(procs):
        tail = log.with_suffix(".node0.log").read_text(errors="replace").splitlines()[-5:]
        raise BenchError(f"{commands[0][:6]} ...: exit codes {codes}; log {log}: {tail}")


def _arm(
    nodes: list, tag: str, work: Path, model: CharLM, steps: int, extra: list[str] | None,
    count: int, timeout: float,
) -> StepTimes:  # fmt: skip
    """One run of an arm: kubeddp with `extra` overrides, or (None) the hand-written loop, on
    the first `count` nodes."""
    summary = work / f"{tag}.json"
    port = free_port()
    env = bench_env(extra={constants.ENV_SUMMARY_FILE: str(summary)})
    if extra is None:
        args = [f"--steps={steps}", f"--summary-file={summary}", *model.baseline_args()]
        cmds = [_baseline(r, count, HOSTS[0], port, args) for r in range(count)]
    else:
        overrides = [
            *model.overrides(), f"train.max_steps={steps}", f"checkpoint.dir={work / tag}",
            "checkpoint.resume=never", "metrics.port=0", *extra,
        ]  # fmt: skip
        cmds = [_kubeddp(r, count, HOSTS[0], port, overrides) for r in range(count)]
    _run_nodes(nodes[:count], cmds, env, work / f"{tag}.log", timeout)
    return StepTimes.read(summary)


def network_check_line(work: Path, tag: str) -> str:
    """What kubeddp's network check printed in the run `tag` (rank 0's log, node 0)."""
    text = (work / f"{tag}.node0.log").read_text(errors="replace")
    found = re.search(r"\[kubeddp\] network check (\(.*)", text)
    return found.group(1) if found else "no network check line"


def bench_multinode(
    work: Path, model: CharLM, steps: int, reps: int, rate: str, timeout: float
) -> list[Row]:
    from tests.helpers import netns, shaping

    if os.geteuid() != 0:
        why = "needs root (network namespaces); run make bench with sudo"
        return [not_measured(SECTION, "2 nodes over a shaped link", why)]
    work.mkdir(parents=True, exist_ok=True)
    # PowerSGD starts inside the steps the throughput leaves out (the first 20%)
    hooks = {
        "bf16": ["ddp.comm_hook=bf16"],
        "powersgd": ["ddp.comm_hook=powersgd", f"ddp.powersgd_start_step={max(2, steps // 10)}"],
    }
    arms: dict[str, list[str] | None] = {"baseline": None, "kubeddp": [], **hooks}
    two: dict[str, list[StepTimes]] = {arm: [] for arm in arms}
    one: dict[str, list[StepTimes]] = {"baseline": [], "kubeddp": []}
    with netns.cluster(HOSTS) as nodes:
        for node in nodes:
            shaping.shape_link(node, rate)
        for rep in range(reps):
            for arm, extra in arms.items():
                two[arm].append(
                    _arm(nodes, f"{arm}-2n-{rep}", work, model, steps, extra, 2, timeout)
                )
            for arm in one:
                one[arm].append(
                    _arm(nodes, f"{arm}-1n-{rep}", work, model, steps, arms[arm], 1, timeout)
                )
    check = network_check_line(work, "kubeddp-2n-0")
    return _rows(two, one, model, steps, rate, check)


def _rows(
    two: dict[str, list[StepTimes]], one: dict[str, list[StepTimes]], model: CharLM,
    steps: int, rate: str, check: str,
) -> list[Row]:  # fmt: skip
    """Each arm against the hand-written loop (fused AdamW, as kubeddp) run next to it: the
    median of the alternating pairs, in wall-clock samples/s (the link sets the pace) and in
    samples per CPU-second of rank 0 beside it; then the scaling efficiencies."""
    what = f"{model.describe()}, 2 nodes x 1 process, gloo, link {rate} (tbf), {steps} steps"
    sps = {arm: [t.samples_per_second() for t in runs] for arm, runs in two.items()}
    best = max(HOOKS, key=lambda h: median(sps[h]))
    against = "baseline_ddp.py (fused AdamW, as kubeddp) on the same 2 nodes, alternating"

    def pairs(arm: str, of) -> list[tuple[float, float]]:  # noqa: ANN001
        return [(of(a), of(b)) for a, b in zip(two[arm], two["baseline"], strict=True)]

    rows = []
    for arm, name, goal, note in (
        ("kubeddp", "kubeddp defaults / hand-written loop, same link", ">= 1.0",
         f"{what}; network check: {check}"),
        (best, f"kubeddp with the best hook ({best}) / hand-written loop, same link", "", what),
        *((hook, f"kubeddp with {hook} / hand-written loop, same link", "", "")
          for hook in HOOKS if hook != best),
    ):  # fmt: skip
        rows.append(paired(SECTION, name, against, pairs(arm, StepTimes.samples_per_second),
                           "samples/s", goal, note))  # fmt: skip
        rows.append(paired(SECTION, f"samples per CPU-second, {name}", against,
                           pairs(arm, per_cpu_second), "samples per CPU-second", "",
                           "rank 0's CPU (all threads): what each arm works, not what it "
                           "waits for the link"))  # fmt: skip
    single = {arm: [t.samples_per_second() for t in runs] for arm, runs in one.items()}
    for arm, ref, name in (
        ("baseline", "baseline", "hand-written loop"),
        ("kubeddp", "kubeddp", "kubeddp defaults"),
        (best, "kubeddp", f"kubeddp with {best}"),
    ):
        rows.append(paired(
            SECTION, f"scaling efficiency, {name}: 2 nodes / (2 x 1 node)",
            f"twice the one-node, one-process throughput of {ref}, alternating",
            [(a, 2 * b) for a, b in zip(sps[arm], single[ref], strict=True)], "samples/s", "",
            f"{what}; 1 node: no network",
        ))  # fmt: skip
    return rows
