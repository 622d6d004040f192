"""`make lint`'s checks are part of the test suite too, so CI (which runs `make test`) enforces
them: ruff, shellcheck on every shell script, yamllint on the workflows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.timeout(120)


def _run(*argv: str) -> None:
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}{done.stderr}"


def test_ruff_check() -> None:
    _run(str(BIN / "ruff"), "check", ".")


def test_ruff_format() -> None:
    _run(str(BIN / "ruff"), "format", "--check", ".")


def test_shellcheck_every_script() -> None:
    scripts = sorted(str(p.relative_to(REPO)) for p in REPO.glob("tests/**/*.sh"))
    _run(str(BIN / "shellcheck"), *scripts, ".ci/run")


def test_yamllint_workflows() -> None:
    _run(str(BIN / "yamllint"), "-s", ".github/workflows")
