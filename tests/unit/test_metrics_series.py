"""How many series a pod serves, and a 1,024-GPU job (128 pods x 8 GPUs): counted on the real
/metrics text of a pod with 8 local ranks (8 workers' metric files, 8 heartbeat records, rank
0's network check), by default and with metrics.per_rank, and compared with docs/metrics.md's
table; the text passes `promtool check metrics` (Prometheus' naming rules)."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kubeddp.trainer.config import MetricsConfig, load_config
from kubeddp.trainer.launcher.diag_metrics import ProgressCollector
from kubeddp.trainer.launcher.network_metrics import NetworkCheckCollector
from kubeddp.trainer.launcher.stall_watch import StallWatch
from kubeddp.trainer.launcher.worker_metrics import WorkerMetricsCollector
from kubeddp.trainer.process_contract import NETWORK_CHECK_FILE, PHASE_CODE
from kubeddp.trainer.worker.heartbeat import Heartbeat
from kubeddp.trainer.worker.metrics import TrainingMetrics
from kubeddp.trainer.worker.netcheck_plan import GB, MIB, CheckResult, Link, Member, judge
from kubeddp.trainer.worker.network import write_results
from tests.helpers.metrics import on_step_values
from tests.helpers.readme import DOCS, doc_section

LOCAL_RANKS, PODS = 8, 128
PROMTOOL = shutil.which("promtool")


def _network_check(path: Path) -> None:
    """Rank 0's check of a 128-node job: three message sizes, a slowest pair that is not slow."""
    members = [Member(n * LOCAL_RANKS, n, 0, f"job-worker-{n}", f"node-{n}") for n in range(4)]
    links = [Link(a, b, 40 * GB) for a, b in itertools.combinations(members, 2)]
    links[0] = Link(links[0].a, links[0].b, 30 * GB)
    result = CheckResult(LOCAL_RANKS * PODS, PODS, 4.0, {MIB: 1e9, 8 * MIB: 2e9, 64 * MIB: 3e9})
    result.verdict = judge(links, 1.5)
    write_results(result, path)


def pod_text(tmp_path: Path, pod: int, per_rank: bool) -> str:
    """The /metrics text of pod `pod` of the job while it trains: its 8 ranks past their first
    log step; pod 0 holds global rank 0, which saved a checkpoint and ran the network check."""
    directory = tmp_path / f"metrics-{pod}-{per_rank}"
    directory.mkdir()
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    cfg = load_config(None, [f"checkpoint.dir={tmp_path / 'ckpt'}"])
    watch = StallWatch(cfg.diagnostics, cfg.checkpoint.dir, print)
    beats = []
    try:
        for local in range(LOCAL_RANKS):
            rank = pod * LOCAL_RANKS + local
            monkeypatch.setenv("LOCAL_RANK", str(local))
            m = TrainingMetrics(MetricsConfig(), rank, LOCAL_RANKS * PODS, "nccl")
            m.on_plan(1000)
            for step in (1, 2):
                m.on_step(**on_step_values(step=step, samples=8, step_seconds=0.2))
            if rank == 0:
                m.on_checkpoint(duration_seconds=2.0, timestamp=1000.0)
                _network_check(directory / NETWORK_CHECK_FILE)
            m.close()
            hb = Heartbeat(watch.directory, rank)
            hb.step_done(2, PHASE_CODE["step"], 0.15)
            beats.append(hb)
        registry = CollectorRegistry()
        registry.register(WorkerMetricsCollector(str(directory), per_rank))
        registry.register(ProgressCollector(watch, per_rank))
        registry.register(NetworkCheckCollector(str(directory)))
        return generate_latest(registry).decode()
    finally:
        for hb in beats:
            hb.close()
        watch.finish(0)
        watch.remove()
        monkeypatch.undo()


def series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def documented_counts() -> dict[str, tuple[int, int, int]]:
    """docs/metrics.md's table: setting -> (an ordinary pod, rank 0's pod, the 1,024-GPU job)."""
    rows = re.findall(
        r"^\| (default|`metrics\.per_rank: true`) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|$",
        doc_section(DOCS / "metrics.md", "How many series"),
        re.MULTILINE,
    )
    return {name: tuple(int(n.replace(",", "")) for n in numbers) for name, *numbers in rows}


@pytest.mark.parametrize(
    ("per_rank", "row"), [(False, "default"), (True, "`metrics.per_rank: true`")]
)
def test_the_documented_series_counts_are_what_a_pod_serves(
    tmp_path: Path, per_rank: bool, row: str
) -> None:
    ordinary, first = (
        series(pod_text(tmp_path, 5, per_rank)),
        series(pod_text(tmp_path, 0, per_rank)),
    )
    job = (PODS - 1) * ordinary + first
    print(f"\nper_rank={per_rank}: pod {ordinary}, rank 0's pod {first}, 1,024 GPUs {job}")
    assert documented_counts()[row] == (ordinary, first, job)


def test_by_default_no_family_grows_with_more_than_one_series_per_rank(tmp_path: Path) -> None:
    """The bound: at 1,024 GPUs no family has more than one series per rank (1,024)."""
    text = pod_text(tmp_path, 5, per_rank=False)
    names = [re.match(r"[a-z_]+", line).group(0) for line in text.splitlines()
             if line and not line.startswith("#")]  # fmt: skip
    families: dict[str, int] = {}
    for name in names:
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        families[base] = families.get(base, 0) + 1
    per_rank = {name: n for name, n in families.items() if n > LOCAL_RANKS}
    assert per_rank == {"kubeddp_step_duration_seconds": 16}, per_rank  # one histogram a pod


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) missing")
@pytest.mark.parametrize("per_rank", [False, True])
def test_promtool_finds_nothing_to_lint(tmp_path: Path, per_rank: bool) -> None:
    text = pod_text(tmp_path, 0, per_rank)
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
