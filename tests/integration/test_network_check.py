"""The network check names the slow link: four network-namespace nodes, one `kubeddp train`
each (one gloo worker per node, real processes), the link between nodes 1 and 2 shaped ~20x
slower than the others with `tc` (tbf), `network.check=only`.

Every pair of the 4 nodes is measured in 3 rounds (a round-robin tournament); the slowest pair
is named when it lags the median of the 6 pairs, and no other pair is.
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

import pytest

from tests.helpers import netns, procs, shaping

pytestmark = [pytest.mark.netns, pytest.mark.slow]
HOSTS = ["net-host-0", "net-host-1", "net-host-2", "net-host-3"]
KUBEDDP = str(Path(sys.executable).parent / "kubeddp")
RUN_SECONDS = 240
PORT = "29531"


def _argv(rank: int) -> list[str]:
    return [
        KUBEDDP, "train", "--nproc", "1", "--nnodes", str(len(HOSTS)), "--node-rank", str(rank),
        "--master-addr", HOSTS[0], "--master-port", PORT, "--set", "metrics.port=0",
        "--set", "network.check=only", "--set", "network.check_max_mb=1",
        "--set", "network.check_seconds=6",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return procs.child_env({"OMP_NUM_THREADS": "1"})


def run_nodes(nodes: list[netns.Node], tmp_path: Path) -> list[str]:
    """Start every node's `kubeddp train`; wait for all; their logs (all must exit 0)."""
    with contextlib.ExitStack() as stack:
        runs = [
            stack.enter_context(
                procs.started(node.wrap(_argv(i)), tmp_path / f"node{i}.log", _env())
            )
            for i, node in enumerate(nodes)
        ]
        codes = [run.wait(RUN_SECONDS) for run in runs]
        tails = "\n".join(run.tail() for run in runs)
        assert codes == [0] * len(nodes), f"exit codes {codes}\n{tails}"
        return [run.output() for run in runs]


@pytest.mark.timeout(RUN_SECONDS + 90)
def test_the_check_names_exactly_the_slow_pair(tmp_path: Path) -> None:
    with netns.cluster(HOSTS) as nodes:
        shaping.shape_pair(nodes[1], nodes[2], "20mbit")
        logs = run_nodes(nodes, tmp_path)
    rank0 = logs[0]
    check = [line for line in rank0.splitlines() if "] network check (" in line]
    assert len(check) == 1, rank0[-3000:]
    assert "4 ranks on 4 nodes" in check[0] and "all-reduce bus bandwidth" in check[0]
    assert re.search(r"bandwidth [\d.]+ [MG]B/s at 16 KiB", check[0]), check[0]  # 1/64 of 1 MiB
    slow = [line for line in rank0.splitlines() if "slow network link" in line]
    assert len(slow) == 1, rank0[-3000:]
    assert re.search(r"slow network link net-host-1 <-> net-host-2: ", slow[0]), slow[0]
    assert "below the median of the 6 node pairs" in slow[0]
    assert "network check done (network.check=only): no training" in rank0
    for log in logs[1:]:  # rank 0 alone reports
        assert "slow network link" not in log and "] network check (" not in log
