#!/usr/bin/env python3
"""One version string for every artifact of a release: the tag, trainer/__init__.py's
__version__ (the wheel and `kubeddp --version`), Chart.yaml's version and appVersion (the chart
and its default image tag), the Dockerfile's VERSION default (the image label) and CHANGELOG.md's
newest release. Exit 0 when they agree, else one line per disagreement and exit 1.

    python3 .ci/release_version.py [TAG]      # TAG: v0.1.0 or 0.1.0; the release workflow's tag
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _find(path: str, pattern: str) -> str:
    found = re.search(pattern, (REPO / path).read_text(), re.MULTILINE)
    return found.group(1) if found else f"(no match for {pattern!r})"


def versions() -> dict[str, str]:
    return {
        "trainer/__init__.py __version__": _find("trainer/__init__.py", r'^__version__ = "(.+)"$'),
        "Chart.yaml version": _find("charts/kubeddp/Chart.yaml", r"^version: (\S+)$"),
        "Chart.yaml appVersion": _find("charts/kubeddp/Chart.yaml", r'^appVersion: "(.+)"$'),
        "Dockerfile ARG VERSION": _find("Dockerfile", r"^ARG VERSION=(\S+)$"),
        "CHANGELOG.md newest release": _find("CHANGELOG.md", r"^## \[(\d[^\]]*)\]"),
    }


def problems(tag: str | None) -> list[str]:
    found = versions()
    expected = tag.removeprefix("v") if tag else found["trainer/__init__.py __version__"]
    return [f"{where} is {value}, not {expected}" for where, value in found.items()
            if value != expected]  # fmt: skip


def main(argv: list[str]) -> int:
    tag = argv[0] if argv else None
    found = problems(tag)
    for line in found:
        print(f"release_version: {line}", file=sys.stderr)
    if not found:
        print(next(iter(versions().values())))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
