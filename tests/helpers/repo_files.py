"""The repository's tracked files and what they say, for the tests that derive facts from them
(which files name every metric, kind or command; which files are generated)."""

from __future__ import annotations

import ast
import functools
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED_MARK = "do not edit"  # in the first lines of every file `make chart`/`make k8s` writes
HEADER_LINES = 6


@functools.cache
def tracked() -> tuple[str, ...]:
    """Every file git tracks, as a repository path (what a clone has)."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return tuple(name for name in listed if (REPO / name).is_file())


@functools.cache
def text(name: str) -> str:
    """The file's text; empty for a binary file."""
    try:
        return (REPO / name).read_text()
    except UnicodeDecodeError:
        return ""


def header(name: str) -> str:
    """The first lines, up to the one that says `do not edit` (all of them when none does)."""
    lines = text(name).splitlines()[:HEADER_LINES]
    ends = [i for i, line in enumerate(lines) if GENERATED_MARK in line.lower()]
    return "\n".join(lines[: ends[0] + 1] if ends else lines)


def is_generated(name: str) -> bool:
    """Written by `make chart` or `make k8s` (their generators spell the mark, and are not)."""
    return not name.endswith((".py", ".sh")) and GENERATED_MARK in header(name).lower()


@functools.cache
def string_constants(name: str) -> frozenset[str]:
    """The string literals of a Python file (f-string parts included)."""
    try:
        tree = ast.parse(text(name))
    except SyntaxError:
        return frozenset()
    return frozenset(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    )
