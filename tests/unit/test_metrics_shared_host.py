"""Two nodes of one job on one host (bare metal, `kubeddp train --nnodes 2` twice): the second
finds the metrics port taken, which is expected there, so it serves on a free port without a
warning; a single node that finds it taken still warns (real servers on 127.0.0.1)."""

from __future__ import annotations

import os
import urllib.request

import pytest

from kubeddp.trainer import constants, process_contract
from kubeddp.trainer.config import MetricsConfig
from kubeddp.trainer.launcher.metrics_server import start_for_launch


@pytest.fixture(autouse=True)
def own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (constants.ENV_METRICS_PORT, constants.ENV_METRICS_BIND,
                 process_contract.ENV_PROMETHEUS_MULTIPROC_DIR):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_second_node_on_one_host_serves_elsewhere_quietly() -> None:
    first = start_for_launch(MetricsConfig(port=0, bind="127.0.0.1"), False, print)
    assert first is not None
    lines: list[str] = []
    try:
        cfg = MetricsConfig(port=first.port, bind="127.0.0.1")
        alone = start_for_launch(cfg, False, lines.append)
        assert alone is None and "warning: metrics off" in lines[-1]
        second = start_for_launch(cfg, False, lines.append, shared_host=True)
        assert second is not None and second.port != first.port
        try:
            assert lines[-1].endswith(f"(port {first.port} is another node's here)")
            assert not any("warning" in line for line in lines[1:])
            with urllib.request.urlopen(second.url, timeout=5) as answer:
                assert answer.status == 200
        finally:
            second.close(0, lines.append)
    finally:
        first.close(0, print)
    assert process_contract.ENV_PROMETHEUS_MULTIPROC_DIR not in os.environ
