"""The torch pyproject.toml declares is what CI tests: a lower bound only (no cap: a cap makes
pip replace a user's newer torch), equal to the oldest release the workflow's torch-range
matrix runs; the matrix's newest release is the launcher's NEWEST_TESTED_TORCH (a newer torch
launches with a note); the pinned torch of `make setup` and of the main CI jobs is admitted."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from kubeddp.trainer.launcher.torch_check import NEWEST_TESTED_TORCH

REPO = Path(__file__).resolve().parents[2]


def torch_requirement() -> Requirement:
    text = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert deps, "pyproject.toml: no dependencies list"
    found = [Requirement(d) for d in re.findall(r'"([^"]+)"', deps.group(1))]
    (torch,) = [r for r in found if r.name == "torch"]
    return torch


def lower_bound(req: Requirement) -> Version:
    """The lowest admitted torch of a `>=X` specifier; an upper bound of any kind fails."""
    specs = {s.operator: Version(s.version) for s in req.specifier}
    assert set(specs) == {">="}, f"torch must be declared as >=X alone, got {req.specifier}"
    return specs[">="]


def ci_torches() -> list[Version]:
    jobs = workflow()["jobs"]
    return sorted(Version(v) for v in jobs["torch-range"]["strategy"]["matrix"]["torch"])


def workflow() -> dict:
    return yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())


def test_the_lower_bound_is_the_oldest_torch_ci_tests() -> None:
    low = lower_bound(torch_requirement())
    assert ci_torches()[0] == low, (
        f"CI's oldest torch {ci_torches()[0]} is not the declared floor {low}"
    )


def test_the_newest_torch_ci_tests_is_the_one_the_launcher_names() -> None:
    assert ci_torches()[-1] == Version(NEWEST_TESTED_TORCH), (
        f"CI's newest torch is {ci_torches()[-1]}, torch_check.NEWEST_TESTED_TORCH says "
        f"{NEWEST_TESTED_TORCH}: keep them equal"
    )


def test_the_pinned_torch_is_admitted() -> None:
    req = torch_requirement()
    pinned = {"ci.yml": workflow()["env"]["TORCH_VERSION"]}
    make = re.search(r"^TORCH_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert make, "Makefile: no TORCH_VERSION"
    pinned["Makefile"] = make.group(1)
    for where, version in pinned.items():
        assert req.specifier.contains(version), f"{where} pins torch {version} outside {req}"
        assert Version(version) <= ci_torches()[-1], f"{where} pins a torch CI's range job lacks"
