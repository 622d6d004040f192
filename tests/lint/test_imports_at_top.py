"""Imports sit at the top of a module, where a reader sees what it depends on. An import inside
a function says why: a comment on its line or the line above it, or one line at the module's top
level starting `# Imported in functions:` for every such import of the module (what the import
would cost there, or the optional dependency it waits for)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "tools", "kubeddp")
MODULE_REASON = re.compile(r"^# Imported in functions: \S", re.M)


def _imports_in_functions(tree: ast.Module) -> list[ast.stmt]:
    found: dict[int, ast.stmt] = {}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found[id(node)] = node
    return sorted(found.values(), key=lambda n: n.lineno)


def _says_why(lines: list[str], node: ast.stmt) -> bool:
    own = lines[node.lineno - 1]
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return "#" in own or above.startswith("#")


def unexplained(root: Path) -> list[str]:
    """`path:line module` of each import inside a function that does not say why."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            if MODULE_REASON.search(text):
                continue
            lines = text.splitlines()
            for node in _imports_in_functions(ast.parse(text)):
                if not _says_why(lines, node):
                    name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    out.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return out


def test_every_import_inside_a_function_says_why() -> None:
    found = unexplained(REPO)
    assert not found, (
        "imports inside functions without a reason (move them to the module's top, or say why "
        "in a comment; see this test's docstring):\n" + "\n".join(found)
    )


def test_the_rule_finds_an_unexplained_import(tmp_path: Path) -> None:
    module = tmp_path / "trainer" / "m.py"
    module.parent.mkdir()
    module.write_text("import os\n\n\ndef f():\n    import json\n    return json\n")
    assert unexplained(tmp_path) == ["trainer/m.py:5 json"]
    module.write_text("def f():\n    import json  # json costs the help 1 s\n    return json\n")
    assert unexplained(tmp_path) == []
    module.write_text("# Imported in functions: torch, off the help's path.\ndef f():\n"
                      "    import json\n    return json\n")  # fmt: skip
    assert unexplained(tmp_path) == []
