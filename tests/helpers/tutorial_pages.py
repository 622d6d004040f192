"""The code blocks of the DDP tutorials our users learn from (../shared/tutorials: markdown
pages in .txt files, reference material kept beside the project, never copied into it), read
at test time. $KUBEDDP_TUTORIALS_DIR points at another copy (a relative path is taken from the
repository root); without one the tests that read them skip, saying where they looked."""

from __future__ import annotations

import hashlib
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = "KUBEDDP_TUTORIALS_DIR"
# A fence (``` or ~~~, indented inside a list too) with its language word, and what it holds.
FENCE = re.compile(r"^([ \t]*)(```|~~~)[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*\2[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: str  # the page's number: "001"
    index: int  # the block's place on its page, from 0
    language: str  # the fence's word ("py", "bash", ""), as the page wrote it
    code: str  # dedented

    @property
    def key(self) -> str:
        return f"{self.page}#{self.index:02d}"


def tutorials_dir() -> Path:
    """$KUBEDDP_TUTORIALS_DIR, else shared/tutorials beside the checkout (../shared from
    a clone, ../../shared from a worktree kept in a folder beside it)."""
    configured = os.environ.get(ENV)
    if configured:
        return REPO / configured
    beside = [folder / "shared" / "tutorials" for folder in REPO.parents[:2]]
    return next((folder for folder in beside if folder.is_dir()), beside[0])


def pages() -> dict[str, Path]:
    """Each page by its number ("000"); the test skips, saying where they are looked for, when
    this checkout has no copy (the pages are not part of the repository)."""
    found = {p.name[:3]: p for p in sorted(tutorials_dir().glob("[0-9][0-9][0-9]_*.txt"))}
    if not found:
        pytest.skip(f"no tutorial pages in {tutorials_dir()}; set {ENV} to their folder")
    return found


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def blocks(page: str, path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [
        Block(page, index, match.group(3), textwrap.dedent(match.group(4)))
        for index, match in enumerate(FENCE.finditer(text))
    ]
