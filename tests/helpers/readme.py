"""Sections of the README, for tests that keep its tables true."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_section(title: str) -> str:
    """The text under `## {title}` up to the next `## ` heading (outside code blocks)."""
    lines = README.read_text().splitlines()
    out: list[str] = []
    inside = fence = False
    for line in lines:
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("## "):
            if inside:
                break
            inside = line[3:].strip() == title
            continue
        if inside:
            out.append(line)
    if not out:
        raise AssertionError(f"README.md has no section '## {title}'")
    return "\n".join(out) + "\n"
