"""docs/exit-codes.md is generated from trainer/exit_codes.TABLE (`make chart`), is current, and
the README's "Exit codes" section links it."""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest

from kubeddp.tools.generate.exit_codes_doc import EXIT_CODES_DOC, exit_codes_doc
from kubeddp.trainer import exit_codes

pytestmark = pytest.mark.timeout(30)
REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| (training|cli|both) \| [^|]+ \| ([^|]+) \| [^|]+ \|$")


def test_the_page_is_current() -> None:
    assert (REPO / EXIT_CODES_DOC).read_text() == exit_codes_doc(), "stale; run `make chart`"


def test_every_code_has_one_row_saying_who_retries_it() -> None:
    rows = {
        int(found[1]): (found[2].strip(), found[4])
        for line in exit_codes_doc().splitlines()
        if (found := ROW.match(line))
    }
    assert sorted(rows) == sorted(entry.code for entry in exit_codes.TABLE)
    for entry in exit_codes.TABLE:
        name, retried = rows[entry.code]
        assert name == entry.name
        if entry.where != "cli" and entry.code != exit_codes.OK:
            assert ("recreated" in retried) is entry.retryable, entry
    for code in exit_codes.CASCADE:  # what the Indexed Job's policy ignores
        assert "not counted" in rows[code][1]
    assert "counted against backoffLimit" in rows[exit_codes.KILLED][1]


def test_readme_exit_codes_section_links_the_page() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert f"({EXIT_CODES_DOC.as_posix()})" in section


def code_constants(module: object) -> dict[str, int]:
    """The exit-code constants a module defines: upper-case names bound to an int (the
    threshold RETRYABLE_FROM is not a code)."""
    return {
        name: value
        for name, value in vars(module).items()
        if name.isupper() and type(value) is int and name != "RETRYABLE_FROM"
    }


def test_every_exit_code_constant_has_its_table_row() -> None:
    """A constant without its row in TABLE would end a pod with a code that docs/exit-codes.md,
    describe() and the status line know nothing of."""
    constants = code_constants(exit_codes)
    assert sorted(constants.values()) == sorted(entry.code for entry in exit_codes.TABLE)
    assert len(set(constants.values())) == len(constants), "two names for one code"
    unused = next(code for code in range(200, 256) if code not in exit_codes.BY_CODE)
    forgot = types.SimpleNamespace(**vars(exit_codes), SLOW_STORAGE=unused)  # no row for it
    assert set(code_constants(forgot).values()) - set(exit_codes.BY_CODE) == {unused}


# ---- Every code of the table is one that something ends with (issue 38): a row with nothing
# behind it documents an end no pod or command can reach. A use counts when the constant is
# returned, raised, exited with, passed or assigned (`return exit_codes.X`, `os._exit(X)`,
# `Outcome(X)`, `code = X`, `exit_code = X`); comparing with it (`==`, `in`), listing it in a
# table of codes (a tuple, a set), naming it in text (an f-string, `describe(X)`) and the
# generators of the docs (tools/generate/) do not end anything.
PRODUCT = ("trainer", "tools", "kubeddp")
NOT_AN_END = (ast.Compare, ast.FormattedValue, ast.Tuple, ast.List, ast.Set)


def _ends_with(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents[node]
    if isinstance(parent, NOT_AN_END):
        return False
    if isinstance(parent, ast.Call) and node in parent.args:
        name = parent.func.attr if isinstance(parent.func, ast.Attribute) else ""
        return getattr(parent.func, "id", name) != "describe"
    return True


def codes_ended_with(sources: dict[str, str], names: set[str]) -> set[str]:
    """The names of `names` (exit_codes constants) that one of `sources` ends with."""
    found = set()
    for path, source in sources.items():
        tree = ast.parse(source, path)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                named = node.attr
            elif isinstance(node, ast.Name):
                named = node.id
            else:
                continue
            if named in names and _ends_with(node, parents):
                found.add(named)
    return found


def _functions_only(source: str) -> str:
    """The module's functions: the table's own module defines every code, and its mapping
    functions (`for_signal`, `documented`) are where some ends are decided."""
    body = ast.parse(source).body
    return "\n\n".join(ast.unparse(n) for n in body if isinstance(n, ast.FunctionDef))


def product_sources() -> dict[str, str]:
    """The product's modules that may end with a code (of the table's module only its
    functions; not the generators)."""
    sources = {
        rel: path.read_text()
        for folder in PRODUCT
        for path in sorted((REPO / folder).rglob("*.py"))
        if not (rel := path.relative_to(REPO).as_posix()).startswith("tools/generate/")
    }
    table = "trainer/exit_codes.py"
    return {**sources, table: _functions_only(sources[table])}


def test_every_exit_code_is_one_something_ends_with() -> None:
    names = set(code_constants(exit_codes))
    never = sorted(names - codes_ended_with(product_sources(), names))
    assert not never, (
        "these exit codes are in trainer/exit_codes.py's TABLE (and docs/exit-codes.md) but no "
        "module returns, raises or exits with them: wire each where that end happens, or remove "
        "its constant and row (then make chart):\n" + "\n".join(never)
    )


def test_the_ends_check_tells_an_end_from_a_mention() -> None:
    # It must be able to fail: only the first three end anything.
    source = """
from kubeddp.trainer import exit_codes
from kubeddp.trainer.exit_codes import STALLED

def run(code):
    if code == exit_codes.PEER_FAILED or code in (exit_codes.KILLED,):
        print(f"{exit_codes.PREEMPTED}", exit_codes.describe(exit_codes.NONFINITE))
        return exit_codes.OK
    raise SystemExit(exit_codes.BAD_INPUT)

class Failure(Exception):
    exit_code = STALLED
"""
    names = set(code_constants(exit_codes))
    assert codes_ended_with({"t.py": source}, names) == {"OK", "BAD_INPUT", "STALLED"}
