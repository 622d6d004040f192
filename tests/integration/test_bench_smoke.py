"""The bench machinery on a tiny size, so `make bench` does not rot between releases: the
overhead benchmark and the GPU bench (on the CPU) run their real processes.

No timing is asserted: only that each piece runs and produces well-formed ratios.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.bench.common import REPO_ROOT


@pytest.mark.timeout(300)
def test_tiny_overhead_run_writes_a_report(tmp_path) -> None:
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "tests.bench.run", "--tiny", "--only", "overhead"]
    proc = subprocess.run(
        [*cmd, "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    rows = report["rows"]
    assert {row["section"] for row in rows} == {"overhead"}, rows
    assert len(rows) == 10, [row["name"] for row in rows]
    for row in rows:
        assert row["ratio"] is not None, row["note"]
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0
    table = (out / "report.md").read_text()
    assert "| section | benchmark | ratio |" in table
    assert "kubeddp / hand-written DDP loop" in table


@pytest.mark.timeout(120)
def test_gpu_bench_cpu_tiny_runs_kubeddp_and_the_hand_written_loop(tmp_path) -> None:
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, "-m", "tests.bench.gpu", "--device", "cpu", "--tiny", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    arms = {arm["key"]: arm for arm in report["arms"]}
    for key in ("tiny:hand-written:eager:bf16", "tiny:kubeddp:eager:bf16"):
        assert arms[key]["status"] == "ok", arms[key]
        assert arms[key]["tokens_per_s"] > 0 and math.isfinite(arms[key]["mfu"])
        # warm-up 10 steps + two timed windows of 10
        assert len(arms[key]["window_tokens_per_s"]) == 2
    assert arms["tiny:kubeddp:compiled:bf16"]["status"].startswith("skipped (--tiny")
    ratio = next(r for r in report["rows"] if r["name"].endswith("hand-written loop, eager bf16"))
    assert math.isfinite(ratio["ratio"]) and ratio["ratio"] > 0
    assert "kubeddp, eager, bf16" in proc.stdout and "x hand-written" in proc.stdout


@pytest.mark.netns
@pytest.mark.timeout(600)
def test_tiny_multinode_run_measures_every_arm_across_two_namespace_nodes(tmp_path) -> None:
    """Two network-namespace nodes on a tc-shaped link: every arm runs for real (a failed one
    would be a 'not measured' row with no ratio) and kubeddp's network check line is kept."""
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "tests.bench.run", "--tiny", "--only", "multinode"]
    proc = subprocess.run(
        [*cmd, "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=580
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((out / "report.json").read_text())["rows"]
    assert {row["section"] for row in rows} == {"across nodes"}, rows
    # defaults, best hook and the other hook vs the loop (wall and CPU); 3 scaling efficiencies
    assert len(rows) == 9, [(row["name"], row["note"]) for row in rows]
    for row in rows:
        assert row["ratio"] is not None, row["note"]
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0
    defaults = next(row for row in rows if row["name"].startswith("kubeddp defaults /"))
    assert "2 ranks on 2 nodes): all-reduce bus bandwidth" in defaults["note"], defaults["note"]
