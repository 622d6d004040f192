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


# ---- Every family is recorded (issue 38): a Family declared in trainer/worker/metrics.py that
# launch does not serve (not in FAMILIES), or that nothing records, is a metric left half way:
# left out of /metrics, or (given a constant where the worker starts) a constant the table above
# cannot tell from a real value. A family is recorded where the worker keeps a value under its
# name that is not a constant (`values[X.name] = v`, `values[_X] += v`, `{X.name: v}`), its
# histogram's observations included; an info family (merge `labels`) where launch serves its
# labels (`family is X` in launcher/worker_metrics.py).
TRAINER = Path(__file__).resolve().parents[2] / "trainer"
METRICS = TRAINER / "worker" / "metrics.py"
SERVER = TRAINER / "launcher" / "worker_metrics.py"


def declared_families(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Module-level `X = Family("kubeddp_x", kind, doc, merge, ...)` -> {X: (name, merge)}."""
    found = {}
    for node in tree.body:
        call = node.value if isinstance(node, ast.Assign) else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        if call.func.id == "Family" and isinstance(node.targets[0], ast.Name):
            args = [a.value if isinstance(a, ast.Constant) else None for a in call.args]
            merge = next(
                (getattr(k.value, "value", None) for k in call.keywords if k.arg == "merge"), None
            )
            found[node.targets[0].id] = (args[0], merge or (args[3] if len(args) > 3 else None))
    return found


def served_families(tree: ast.Module) -> set[str]:
    """The names in `FAMILIES = (...)`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FAMILIES":
            return {e.id for e in node.value.elts if isinstance(e, ast.Name)}
    return set()


def recorded_families(tree: ast.Module, declared: set[str]) -> set[str]:
    """The families under whose name `tree` keeps a value that is not a constant."""
    aliases = {}  # `_STEP = STEP.name` (or a tuple of them): the alias -> STEP
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            pairs = list(zip(target.elts, value.elts, strict=False))
        else:
            pairs = [(target, value)]
        for name, named in pairs:
            family = _family_of(named, declared, {})
            if family and isinstance(name, ast.Name):
                aliases[name.id] = family

    def varies(value: ast.expr) -> bool:
        return not isinstance(value, ast.Constant)

    recorded = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Subscript):
                    family = _family_of(target.slice, declared, aliases)
                    if family and (isinstance(node, ast.AugAssign) or varies(node.value)):
                        recorded.add(family)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                family = key is not None and _family_of(key, declared, aliases)
                if family and varies(value):
                    recorded.add(family)
    return recorded


def _family_of(node: ast.expr, declared: set[str], aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Name):
        return node.value.id if node.value.id in declared else None
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    return None


def served_by_identity(tree: ast.Module) -> set[str]:
    """`family is X` in launch's collector: an info family served from the record's labels."""
    return {
        c.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.Is)
        for c in node.comparators
        if isinstance(c, ast.Name)
    }


def half_done_families(metrics_source: str, server_source: str) -> list[str]:
    """One line per family declared in metrics_source that launch does not serve or that
    nothing records."""
    tree = ast.parse(metrics_source)
    declared = declared_families(tree)
    served, recorded = served_families(tree), recorded_families(tree, set(declared))
    by_labels = served_by_identity(ast.parse(server_source))
    problems = []
    for family, (name, merge) in sorted(declared.items(), key=lambda kv: str(kv[1][0])):
        if family not in served:
            problems.append(f"{name} ({family}): not in FAMILIES, so launch never serves it")
        elif family not in recorded and not (merge == "labels" and family in by_labels):
            problems.append(f"{name} ({family}): nothing records it (no value but a constant)")
    return problems


def test_every_declared_family_is_recorded() -> None:
    metrics_source = METRICS.read_text()
    assert len(declared_families(ast.parse(metrics_source))) >= 10
    problems = half_done_families(metrics_source, SERVER.read_text())
    assert not problems, (
        "metric families declared in trainer/worker/metrics.py and left half way: record each "
        "where it is measured (and add it to FAMILIES), or remove it and its docs row:\n"
        + "\n".join(problems)
    )


PLANTED = 'QUEUE_DEPTH = Family("kubeddp_queue_depth", "gauge", "planted", "newest")\nFAMILIES = ('


def test_the_record_check_sees_a_family_left_half_way() -> None:
    # It must be able to fail: a family declared and never recorded, one recorded only as a
    # constant where the worker starts, and one launch does not serve.
    source, server = METRICS.read_text(), SERVER.read_text()
    assert "FAMILIES = (\n" in source and "self._rank_values: dict" in source
    served = source.replace("FAMILIES = (\n", PLANTED + "\n    QUEUE_DEPTH,\n")
    assert half_done_families(served, server) == [
        "kubeddp_queue_depth (QUEUE_DEPTH): nothing records it (no value but a constant)"
    ]
    constant = served.replace(
        "self._rank_values: dict",
        "self._values[QUEUE_DEPTH.name] = 0\n        self._rank_values: dict",
    )
    assert half_done_families(constant, server) == half_done_families(served, server)
    recorded = served.replace(
        "self._rank_values: dict",
        "self._values[QUEUE_DEPTH.name] = world_size\n        self._rank_values: dict",
    )
    assert half_done_families(recorded, server) == []
    unserved = source.replace("FAMILIES = (\n", PLANTED + "\n")
    assert half_done_families(unserved, server) == [
        "kubeddp_queue_depth (QUEUE_DEPTH): not in FAMILIES, so launch never serves it"
    ]
