"""The metrics tables of docs/metrics.md list exactly what a worker exports and pushes."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.metrics import exported_families
from tests.helpers.readme import DOCS, doc_section

METRICS_PAGE = DOCS / "metrics.md"
ROW = re.compile(r"^\| `(kubeddp_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|")


def documented_tables() -> list[dict[str, tuple[str, set[str]]]]:
    """Each metrics table: name -> (type, label names)."""
    tables: list[dict[str, tuple[str, set[str]]]] = []
    current: dict[str, tuple[str, set[str]]] = {}
    for line in doc_section(METRICS_PAGE, "Metrics").splitlines():
        row = ROW.match(line)
        if row:
            labels = set(re.findall(r"`(\w+)`", row.group(3)))
            current[row.group(1)] = (row.group(2), labels)
        elif current and not line.startswith("|"):
            tables.append(current)
            current = {}
    if current:
        tables.append(current)
    return tables


def exported(tmp_path: Path) -> dict[str, tuple[str, set[str]]]:
    out = {}
    for family in exported_families(tmp_path):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        out[name] = (family.type, labels)
    return out


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
