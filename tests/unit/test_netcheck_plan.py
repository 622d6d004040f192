"""The network check's arithmetic: the round-robin pairing covers every node pair once in
O(nodes) rounds, the bus bandwidth is nccl-tests', and the verdict names the slowest pair only
when it lags the median."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubeddp.trainer import process_contract
from kubeddp.trainer.launcher.network_metrics import NetworkCheckCollector
from kubeddp.trainer.worker.netcheck_plan import (
    GB,
    MIB,
    CheckResult,
    Link,
    Member,
    bus_bandwidth,
    fits,
    judge,
    message_sizes,
    pair_message,
    representatives,
    seconds_per_all_reduce,
    tournament,
)
from kubeddp.trainer.worker.network import write_results
from tests.helpers.metrics import metric_rows


@pytest.mark.parametrize("count", range(2, 34))
def test_every_pair_meets_once_and_every_node_once_a_round(count: int) -> None:
    rounds = tournament(count)
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)  # O(nodes)
    pairs = [pair for r in rounds for pair in r]
    assert sorted(pairs) == list(itertools.combinations(range(count), 2))
    for r in rounds:
        busy = [node for pair in r for node in pair]
        assert len(busy) == len(set(busy))
        assert len(r) == count // 2  # every round as full as it can be


def test_no_rounds_for_one_node() -> None:
    assert tournament(1) == [] and tournament(0) == []


def test_bus_bandwidth_is_nccl_tests_formula() -> None:
    # 1 GiB in 10 ms on 16 ranks: algbw 107.4 GB/s, busbw x 2*15/16
    assert bus_bandwidth(2**30, 0.01, 16) == pytest.approx(2**30 / 0.01 * 30 / 16)
    assert bus_bandwidth(2**20, 0.01, 2) == pytest.approx(2**20 / 0.01)
    assert bus_bandwidth(2**20, 0.01, 1) == 0.0 and bus_bandwidth(2**20, 0.0, 8) == 0.0


def test_message_sizes_are_three_float_multiples_up_to_the_maximum() -> None:
    assert message_sizes(64) == [MIB, 8 * MIB, 64 * MIB]
    assert all(size % 4 == 0 for size in message_sizes(0.001))
    assert message_sizes(1e-6) == [4] and message_sizes(1e-5) == [4, 8]


def _member(rank: int, node_rank: int, local: int = 0) -> Member:
    return Member(rank, node_rank, local, f"job-worker-{node_rank}", f"node-{node_rank}")


def test_the_first_rank_of_each_node_represents_it() -> None:
    members = [_member(r, r // 2, r % 2) for r in (5, 4, 3, 2, 1, 0)]
    assert [m.rank for m in representatives(members)] == [0, 2, 4]


def _links(rates: dict[tuple[int, int], float]) -> list[Link]:
    return [Link(_member(a, a), _member(b, b), bw) for (a, b), bw in rates.items()]


def test_the_slowest_pair_is_named_only_when_it_lags_the_median() -> None:
    fast = {pair: 10 * GB for pair in itertools.combinations(range(4), 2)}
    slow = judge(_links({**fast, (1, 2): 2 * GB}), 1.5)
    assert slow.slow and slow.ratio == pytest.approx(5.0)
    assert slow.slowest is not None and slow.slowest.describe() == (
        "job-worker-1 (node-1) <-> job-worker-2 (node-2)"
    )
    almost = judge(_links({**fast, (1, 2): 8 * GB}), 1.5)
    assert not almost.slow and almost.slowest is not None  # still the slowest, not slow


def test_two_nodes_have_one_link_and_no_verdict() -> None:
    one = judge(_links({(0, 1): 0.001 * GB}), 1.5)
    assert not one.slow and one.median == 0.001 * GB
    assert not judge([], 1.5).slow


def _result() -> CheckResult:
    result = CheckResult(world_size=32, nodes=4, seconds=3.2, bus={MIB: 150 * GB, 8 * MIB: 1e8})
    links = {pair: 40 * GB for pair in itertools.combinations(range(4), 2)}
    result.verdict = judge(_links({**links, (0, 3): 4 * GB}), 1.5)
    return result


def test_the_log_lines_give_the_numbers_and_the_pair() -> None:
    result = _result()
    assert result.describe() == (
        "[kubeddp] network check (3.2 s, 32 ranks on 4 nodes): all-reduce bus bandwidth "
        "150.00 GB/s at 1 MiB, 100 MB/s at 8 MiB; node pairs: median 40.00 GB/s, slowest "
        "job-worker-0 (node-0) <-> job-worker-3 (node-3) 4.00 GB/s"
    )
    line = result.slow_line(1.5)
    assert line is not None and line.startswith(
        "[kubeddp] warning: slow network link job-worker-0 (node-0) <-> job-worker-3 (node-3): "
        "4.00 GB/s, 10.0x below the median of the 6 node pairs (network.slow_factor=1.5)"
    )


def _scrape(directory: Path) -> dict:
    registry = CollectorRegistry()
    registry.register(NetworkCheckCollector(str(directory)))
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_the_results_reach_metrics_as_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _scrape(tmp_path) == {}  # no check on this pod: no series
    # where the worker writes them: the metrics directory launch names in its environment
    monkeypatch.setenv(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR, str(tmp_path))
    write_results(_result())
    families = _scrape(tmp_path)
    documented = metric_rows("Network check")
    assert {name: (f.type, {k for s in f.samples for k in s.labels}) for name, f in
            families.items()} == documented  # fmt: skip
    (slow,) = families["kubeddp_network_slow_link_ratio"].samples
    assert slow.value == pytest.approx(10.0)
    assert slow.labels == {
        "pod_a": "job-worker-0", "node_a": "node-0", "pod_b": "job-worker-3", "node_b": "node-3",
    }  # fmt: skip
    bus = {s.labels["message_bytes"]: s.value for s in families[
        "kubeddp_network_bus_bandwidth_bytes_per_second"].samples}  # fmt: skip
    assert bus == {str(MIB): 150 * GB, str(8 * MIB): 1e8}


def test_a_later_check_without_a_slow_link_clears_the_verdict(tmp_path: Path) -> None:
    write_results(_result(), tmp_path / "network-check.json")
    healthy = _result()
    healthy.verdict = judge(_links({(0, 1): 40 * GB, (0, 2): 40 * GB, (1, 2): 39 * GB}), 1.5)
    write_results(healthy, tmp_path / "network-check.json")
    served = _scrape(tmp_path)
    assert "kubeddp_network_slow_link_ratio" not in served  # no verdict: no series
    assert "kubeddp_network_slowest_link_bandwidth_bytes_per_second" in served
    assert json.loads((tmp_path / "network-check.json").read_text())["slow_ratio"] == 0.0


def test_a_size_is_skipped_when_it_would_overrun_the_budget() -> None:
    # 16 ranks at 100 GB/s bus bandwidth: 64 MiB takes 1.26 ms, twice that fits in 5 s
    assert fits(1.0, 64 * MIB, 100 * GB, 16, 5.0)
    # 2 ranks at 22 MB/s: a 64 MiB all-reduce takes 3 s; warm-up and one run do not fit in 2.5 s
    assert seconds_per_all_reduce(64 * MIB, 22e6, 2) == pytest.approx(64 * MIB / 22e6)
    assert not fits(0.5, 64 * MIB, 22e6, 2, 2.5)
    assert fits(0.5, 64 * MIB, 0.0, 1, 2.5)  # one rank: no network, nothing to predict


def test_the_pair_message_shrinks_to_the_budget() -> None:
    assert pair_message(64 * MIB, 40 * GB, 3, 2.5) == 64 * MIB  # fast links: all of it
    small = pair_message(64 * MIB, 11.8e6, 1, 2.5)  # the shaped bench link
    assert small <= 2.5 * 11.8e6 / 2 and small * 2 > 2.5 * 11.8e6 / 2 / 2
    assert pair_message(64 * MIB, 1.0, 7, 2.5) == 64 * 1024  # never below 64 KiB
