"""The metrics tables of docs/metrics.md list exactly what a worker exports and pushes."""

from __future__ import annotations

import ast
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


# ---- Every family is recorded (issue 38): a family declared in trainer/worker/metrics.py that
# nothing sets, increments or observes is still exported (a multiprocess gauge or counter
# writes its 0 when it is made), so the table above cannot tell it from a real one. A family
# counts as recorded where its instrument is set, incremented, observed or given its labels.
METRICS = Path(__file__).resolve().parents[2] / "trainer" / "worker" / "metrics.py"
RECORDS = {"set", "inc", "dec", "observe", "labels"}


def declared_families(source: str) -> dict[str, str]:
    """`_Instruments`' attributes -> the family each holds (`self.step = gauge("kubeddp_step",
    ...)`)."""
    (instruments,) = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == "_Instruments"
    ]
    found = {}
    for node in ast.walk(instruments):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        (target,) = node.targets
        first = node.value.args[0] if node.value.args else None
        if isinstance(target, ast.Attribute) and isinstance(first, (ast.Constant, ast.Name)):
            found[target.attr] = first.value if isinstance(first, ast.Constant) else first.id
    return found


def recorded_instruments(source: str) -> set[str]:
    """The attributes whose instrument `source` records: `X.set(...)`, `X.labels(...)`..."""
    return {
        node.func.value.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in RECORDS
        and isinstance(node.func.value, ast.Attribute)
    }


def test_every_declared_family_is_recorded() -> None:
    source = METRICS.read_text()
    declared = declared_families(source)
    assert len(declared) >= 10 and "kubeddp_step" in declared.values()
    never = sorted(declared[a] for a in set(declared) - recorded_instruments(source))
    assert not never, (
        "these families are declared in trainer/worker/metrics.py but nothing sets, increments "
        "or observes them (they export a constant 0): record each where it is measured, or "
        "remove it and its docs row:\n" + "\n".join(never)
    )


def test_the_record_check_sees_a_family_left_unset() -> None:
    # It must be able to fail: a family added to _Instruments and never recorded.
    source = METRICS.read_text().replace(
        "        self.world_size = gauge(",
        '        self.queue_depth = gauge("kubeddp_queue_depth", "planted")\n'
        "        self.world_size = gauge(",
    )
    declared = declared_families(source)
    assert set(declared) - recorded_instruments(source) == {"queue_depth"}
