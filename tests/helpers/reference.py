"""Where the upstream reference data lives (Kubeflow CRDs, the operators' env matrix).

The files are vendored under tests/reference/ (their upstream commits, paths and sha256 in
tests/reference/SOURCES.md and tests/fetch_reference.sh), so a plain clone has them.
$KUBEDDP_REFERENCE_DIR (a relative path is taken from the repository root) points the tests at
another copy, e.g. one freshly downloaded with `tests/fetch_reference.sh DIR`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = "KUBEDDP_REFERENCE_DIR"
VENDORED = REPO / "tests" / "reference"


def reference_dir() -> Path:
    configured = os.environ.get(ENV)
    return (REPO / configured) if configured else VENDORED


REFERENCE_DIR = reference_dir()
CRDS = REFERENCE_DIR / "crds"
ENV_MATRIX = REFERENCE_DIR / "kubeflow-env-matrix.csv"


def require(path: Path) -> Path:
    """`path`, or the test fails with one line saying how to get it (never FileNotFoundError)."""
    if not path.is_file():
        pytest.fail(
            f"reference file {path} is missing; restore tests/reference with `git checkout -- "
            f"tests/reference` or download it: tests/fetch_reference.sh DIR && export {ENV}=DIR",
            pytrace=False,
        )
    return path


def read_text(path: Path) -> str:
    return require(path).read_text()
