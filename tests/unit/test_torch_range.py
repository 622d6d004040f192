"""The torch range pyproject.toml declares is the range CI tests: the workflow's torch-range
matrix runs the oldest release the range admits and a release of its newest minor, and the
pinned torch of `make setup` and of the main CI jobs lies inside it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def torch_requirement() -> Requirement:
    text = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert deps, "pyproject.toml: no dependencies list"
    found = [Requirement(d) for d in re.findall(r'"([^"]+)"', deps.group(1))]
    (torch,) = [r for r in found if r.name == "torch"]
    return torch


def bounds(req: Requirement) -> tuple[Version, Version]:
    """(lowest admitted, first excluded) from a `>=X,<Y` specifier; anything else fails."""
    specs = {s.operator: Version(s.version) for s in req.specifier}
    assert set(specs) == {">=", "<"}, f"torch must be declared as >=X,<Y, got {req.specifier}"
    return specs[">="], specs["<"]


def workflow() -> dict:
    return yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())


def test_ci_tests_both_ends_of_the_declared_torch_range() -> None:
    low, high = bounds(torch_requirement())
    tested = sorted(
        Version(v) for v in workflow()["jobs"]["torch-range"]["strategy"]["matrix"]["torch"]
    )
    assert tested[0] == low, f"CI's oldest torch {tested[0]} is not the range's floor {low}"
    newest = tested[-1]
    assert newest < high, f"CI tests torch {newest}, which the range {low}..<{high} excludes"
    # The upper bound excludes the first minor nobody tested: it is the newest tested + 1.
    assert (newest.major, newest.minor + 1) == (high.major, high.minor) and high.micro == 0, (
        f"the range ends below {high} but CI's newest torch is {newest}: "
        f"declare <{newest.major}.{newest.minor + 1} or test a {high.major}.{high.minor - 1}.x"
    )


def test_the_pinned_torch_is_inside_the_range() -> None:
    req = torch_requirement()
    pinned = {"ci.yml": workflow()["env"]["TORCH_VERSION"]}
    make = re.search(r"^TORCH_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert make, "Makefile: no TORCH_VERSION"
    pinned["Makefile"] = make.group(1)
    for where, version in pinned.items():
        assert req.specifier.contains(version), f"{where} pins torch {version} outside {req}"
