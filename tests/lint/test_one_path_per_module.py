"""One path per module (issue 26): pyproject's package-dir mapping makes `trainer/x.py` the
module `kubeddp.trainer.x`. The repository root is on pytest's path too, so `import trainer.x`
would also work and load the same file a second time as another module (its own globals,
its own classes: isinstance fails across the two). No code imports the folders by their own
names; everything goes through `kubeddp.`."""

from __future__ import annotations

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("trainer", "tools", "charts")  # mapped to kubeddp.trainer, kubeddp.tools, kubeddp.chart
SKIPPED = {".venv", "build", ".git", "node_modules"}


def _python_files() -> list[Path]:
    """The repository's Python files; the skipped folders are never entered (the venv alone
    holds tens of thousands of files)."""
    found = []
    for root, folders, files in os.walk(REPO):
        folders[:] = [name for name in folders if name not in SKIPPED]
        found += [Path(root, name) for name in files if name.endswith(".py")]
    return found


def second_paths(source: str, filename: str) -> list[str]:
    """`import trainer...` / `from tools... import` lines: the folder's own name, not kubeddp's."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{filename}:{node.lineno}: {n}" for n in names if n.split(".")[0] in FOLDERS]
    return found


def test_no_module_is_imported_by_its_folder_name() -> None:
    problems = [hit for p in _python_files() for hit in second_paths(p.read_text(), str(p))]
    assert problems == [], "import through kubeddp. instead:\n" + "\n".join(problems)


def test_the_check_catches_a_second_path() -> None:
    assert second_paths("from trainer.config import Config\nimport tools.cli", "x.py") == [
        "x.py:1: trainer.config",
        "x.py:2: tools.cli",
    ]
    assert second_paths("from kubeddp.trainer.config import Config", "x.py") == []
