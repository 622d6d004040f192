"""Sections and headings of README.md and docs/*.md, for the tests that keep them true."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
HEADING = re.compile(r"^(#{1,6}) +(.+?)(?: +#+)? *$")  # ATX heading, closing #s dropped


def lines_and_fences(page: Path) -> Iterator[tuple[str, bool]]:
    """Each line of the page, and whether it belongs to a fenced code block (fences included)."""
    fence = ""
    for line in page.read_text().splitlines():
        marker = line.lstrip()[:3]
        if marker in ("```", "~~~") and (not fence or marker == fence):
            fence = "" if fence else marker
            yield line, True
        else:
            yield line, bool(fence)


def doc_section(page: Path, title: str) -> str:
    """The text under the heading `title` (any level), up to the next heading as high or higher.

    A `# comment` inside a code block is not a heading.
    """
    out: list[str] = []
    level = 0
    for line, in_code in lines_and_fences(page):
        heading = None if in_code else HEADING.match(line)
        if heading and level and len(heading[1]) <= level:
            break
        if level:
            out.append(line)
        elif heading and heading[2] == title:
            level = len(heading[1])
    if not out:
        raise AssertionError(f"{page.relative_to(REPO)} has no section '{title}'")
    return "\n".join(out) + "\n"


def readme_section(title: str) -> str:
    """The text under `## {title}` in README.md."""
    return doc_section(README, title)


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML tags
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading fragment of the page, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line, in_code in lines_and_fences(page):
        heading = None if in_code else HEADING.match(line)
        if not heading:
            continue
        base = github_anchor(heading[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found
