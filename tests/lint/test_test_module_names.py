"""Test files are imported by their base name (no __init__.py under tests/): two files with one
name in different folders stop the whole collection ("import file mismatch"). A test module
that imports another one loads it a second time under another name (`tests.unit.test_x` beside
pytest's `test_x`), with its own copies of every table and cache: what tests share lives in
tests/helpers/ (or, for the emulated cluster, the non-test modules of tests/emulation/)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []


def imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, as written (relative imports with their dots)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.append(base)
            found += [f"{base}.{alias.name}".lstrip(".") for alias in node.names if not node.module]
    return found


def imported_test_modules(path: Path) -> list[str]:
    """The test modules `path` imports (by any name: `tests.unit.test_x`, `test_x`, `.test_x`)."""
    stems = {test.stem for test in TESTS.rglob("test_*.py")} | {"conftest"}
    return [name for name in imported_modules(path) if name.rsplit(".", 1)[-1] in stems]


def test_no_module_imports_a_test_module() -> None:
    found = {
        str(path.relative_to(TESTS)): names
        for path in sorted(TESTS.rglob("*.py"))
        if (names := imported_test_modules(path))
    }
    assert found == {}, "move what they share to tests/helpers/"


def test_an_import_of_a_test_module_is_seen(tmp_path: Path) -> None:
    source = tmp_path / "test_sample.py"
    source.write_text(
        "from tests.unit.test_cluster_contract import run\n"
        "import test_emulated_jobs\n"
        "from . import test_rendezvous\n"
        "from tests.helpers import fake_api\n"
    )
    assert imported_test_modules(source) == [
        "tests.unit.test_cluster_contract",
        "test_emulated_jobs",
        "test_rendezvous",
    ]
