"""The metrics tables of docs/metrics.md list exactly what a worker exports and pushes."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.metrics import documented_tables, exported


def test_documented_table_matches_the_exported_metrics(tmp_path: Path) -> None:
    served_table = documented_tables()[0]
    assert exported(tmp_path) == served_table


def test_push_only_metrics_are_documented() -> None:
    push_table = documented_tables()[1]
    assert set(push_table) == {"kubeddp_run_exit_code", "kubeddp_run_finished_timestamp_seconds"}


def test_documented_names_follow_prometheus_conventions() -> None:
    for name, (kind, _) in documented_tables()[0].items():
        assert name.endswith("_total") == (kind == "counter"), name
        assert not re.search(r"_(ms|milliseconds|kb|mb|percent)\b", name), name
