"""`kubeddp launch`/`train` refuse a torch older than pyproject.toml's lower bound (one line
naming the range, exit 2; the range comes from the installed distribution's metadata) and
launch on a torch newer than any tested with one line saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from kubeddp.trainer.launcher import torch_check
from kubeddp.trainer.launcher.torch_check import (
    NEWEST_TESTED_TORCH,
    declared_torch_spec,
    fallback_contains,
    newer_than_tested,
    spec_contains,
    torch_version_problem,
)

pytestmark = pytest.mark.timeout(120)

RANGE = ">=2.4,<2.15"
# (installed torch, inside RANGE?)
VERSIONS = [
    ("2.4.0", True),
    ("2.4.1+cu121", True),
    ("2.13.0+cpu", True),
    ("2.14.1+cu130", True),
    ("2.6.0a0+ecf3bae40a.nv25.01", True),  # NVIDIA's NGC builds are pre-release versions
    ("2.3.1", False),
    ("2.3.1+cu118", False),
    ("2.15.0", False),
    ("2.15.0a0+git1234", False),  # a nightly of the next minor
    ("3.0.0", False),
    ("1.13.1", False),
]


@pytest.mark.parametrize(("installed", "inside"), VERSIONS)
def test_packaging_and_the_fallback_agree(installed: str, inside: bool) -> None:
    assert spec_contains(RANGE, installed) is inside
    assert fallback_contains(RANGE, installed) is inside


@pytest.mark.parametrize(
    ("spec", "installed", "inside"),
    [
        (">=2.4", "2.14.0", True),
        ("~=2.4", "2.9.1", True),
        ("~=2.4", "3.0", False),
        ("==2.13.*", "2.13.0+cpu", True),
        ("==2.13.*", "2.12.1", False),
        ("!=2.5.0,>=2.4", "2.5.0", False),
        ("<=2.14", "2.14.0", True),
        (">2.4", "2.4.0", False),
    ],
)
def test_the_fallback_parser_reads_the_usual_specifiers(
    spec: str, installed: str, inside: bool
) -> None:
    assert fallback_contains(spec, installed) is inside


def test_the_fallback_says_unsure_rather_than_guess() -> None:
    assert fallback_contains(">=2.4,===2.5.0", "2.5.0") is None
    assert fallback_contains(">=2.4", "unknown") is None


def test_the_problem_is_one_line_naming_the_range() -> None:
    problem = torch_version_problem("2.3.1", RANGE)
    assert problem is not None and "\n" not in problem
    assert "torch 2.3.1" in problem and f"torch{RANGE}" in problem
    assert "KUBEDDP_SKIP_TORCH_CHECK=1" in problem
    assert torch_version_problem("2.13.0+cpu", RANGE) is None
    assert torch_version_problem("2.99.0", ">=2.4.1") is None, "no upper bound: no refusal"
    assert torch_version_problem("2.3.1", None) is None, "no declared range: no check"
    assert torch_version_problem(None, RANGE) is None


def test_the_declared_requirement_is_found_among_the_others() -> None:
    requires = [
        "torchvision>=0.19",
        "numpy",
        "torch (>=2.4,<2.15)",
        'pytest>=8; extra == "dev"',
    ]
    assert declared_torch_spec(requires) == RANGE
    assert declared_torch_spec(['torch<3; extra == "gpu"']) is None
    assert declared_torch_spec(["torch"]) is None
    assert declared_torch_spec(None) is None


def test_this_installation_passes() -> None:
    assert torch_check.installed_torch_problem() is None
    assert declared_torch_spec(metadata.requires("kubeddp")), "pyproject declares a torch range"


def _launch_with_torch_metadata(tmp_path: Path, version: str, **env: str) -> tuple[int, str]:
    """`kubeddp launch --dry-run` where the torch distribution metadata says `version` (a
    dist-info directory first on the path; the torch package itself is untouched)."""
    info = tmp_path / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    child_env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.getcwd()}", **env}
    done = subprocess.run(
        [sys.executable, "-m", "kubeddp", "launch", "--dry-run"],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    return done.returncode, done.stderr


# (installed torch, newer than the newest tested 2.15.0?)
NEWER = [
    ("2.15.0", False),
    ("2.15.3+cu130", False),  # a patch release of the tested minor
    ("2.14.1", False),
    ("2.4.1", False),
    ("2.16.0", True),
    ("2.16.0a0+git1234", True),  # a nightly of the next minor
    ("3.0.0", True),
    ("unknown", False),
]


@pytest.mark.parametrize(("installed", "newer"), NEWER)
def test_a_torch_newer_than_tested_is_named_in_one_line(installed: str, newer: bool) -> None:
    note = newer_than_tested(installed, "2.15.0")
    assert (note is not None) is newer
    if note:
        assert "\n" not in note and f"torch {installed}" in note and "2.15.0" in note


def test_launch_refuses_an_old_torch_in_one_line(tmp_path: Path) -> None:
    code, stderr = _launch_with_torch_metadata(tmp_path, "2.3.1")
    spec = declared_torch_spec(metadata.requires("kubeddp"))
    assert code == 2, stderr
    assert stderr.strip().splitlines() == [
        f"kubeddp launch: error: torch 2.3.1 is installed, but kubeddp supports torch{spec}; "
        "install a torch in that range (set KUBEDDP_SKIP_TORCH_CHECK=1 to launch anyway)"
    ]


def test_launch_goes_on_with_a_newer_torch_after_one_line(tmp_path: Path) -> None:
    code, stderr = _launch_with_torch_metadata(tmp_path, "2.99.0")
    assert code == 0, stderr
    (note,) = [line for line in stderr.splitlines() if "2.99.0" in line]
    assert note == (
        "kubeddp launch: note: torch 2.99.0 is newer than any kubeddp was tested with (the "
        f"newest: {NEWEST_TESTED_TORCH}); launching anyway: a problem it causes is worth a "
        "report naming both versions"
    )


def test_the_check_can_be_skipped(tmp_path: Path) -> None:
    code, stderr = _launch_with_torch_metadata(tmp_path, "2.3.1", KUBEDDP_SKIP_TORCH_CHECK="1")
    assert code == 0, stderr
