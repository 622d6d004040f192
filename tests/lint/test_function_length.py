"""No function in trainer/launcher/ over 50 lines (issue 26): the launcher reads as small steps.
A function's length is counted from its `def` line to its last line, both included, with its
docstring, comments and blank lines (decorators not counted); nested functions count inside
their parent and on their own."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKED = REPO / "trainer" / "launcher"
MAX_LINES = 50


def long_functions(source: str, filename: str, limit: int = MAX_LINES) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append(f"{filename}:{node.lineno} {node.name}: {length} lines")
    return found


def test_counter_sees_a_long_function() -> None:
    # The checker itself must be able to fail: 51 lines def-to-end is one too many.
    body = "".join(f"    x{i} = {i}\n" for i in range(50))
    assert long_functions(f"def f():\n{body}", "t.py") == ["t.py:1 f: 51 lines"]
    assert long_functions(f"def f():\n{body[: body.rindex('    x49')]}", "t.py") == []


def test_no_launcher_function_over_50_lines() -> None:
    found = [
        line
        for path in sorted(CHECKED.rglob("*.py"))
        for line in long_functions(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert not found, f"functions over {MAX_LINES} lines (split them):\n" + "\n".join(found)
