"""The rooms table in docs/maintainers.md is the layout: every folder of Python code in trainer/,
tools/ and kubeddp/ has its row, every row names a folder that exists, and the package each row
names is the one pyproject.toml's `package-dir` maps the folder to and lists for the wheel (a
room left out of `packages` would be missing from the installed kubeddp)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([^`]+)/` \| (?:`([^`]+)`|\(not in the wheel\)) \|", re.MULTILINE)


def _rows() -> dict[str, str | None]:
    text = (REPO / "docs" / "maintainers.md").read_text()
    section = text.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    return {folder: package or None for folder, package in ROW.findall(section)}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_of(folder: str) -> str | None:
    """The dotted package `package-dir` maps a folder to (longest mapped prefix)."""
    mapping = {v.rstrip("/"): k for k, v in _pyproject()["package-dir"].items()}
    for root in sorted(mapping, key=len, reverse=True):
        if folder == root or folder.startswith(root + "/"):
            rest = folder[len(root) :].strip("/")
            return ".".join([mapping[root], *rest.split("/")]) if rest else mapping[root]
    return None


def _code_folders() -> set[str]:
    found = set()
    for top in ("trainer", "tools", "kubeddp"):
        for init in (REPO / top).rglob("__init__.py"):
            found.add(init.parent.relative_to(REPO).as_posix())
    return found


def test_every_code_folder_has_its_row() -> None:
    missing = _code_folders() - set(_rows())
    assert not missing, f"folders without a row in docs/maintainers.md's rooms: {sorted(missing)}"


def test_every_row_names_a_folder_and_its_package() -> None:
    packages = set(_pyproject()["packages"])
    for folder, package in _rows().items():
        assert (REPO / folder).is_dir(), f"the rooms table names {folder}/, which is not there"
        if package is None:
            assert _package_of(folder) not in packages, f"{folder}/ is said not to ship"
            continue
        assert _package_of(folder) == package, f"{folder}/ is {_package_of(folder)}, not {package}"
        assert package in packages, f"{package} ({folder}/) is not in pyproject's packages"


def test_every_shipped_code_folder_is_in_the_wheel() -> None:
    rows = _rows()
    packages = set(_pyproject()["packages"])
    for folder in _code_folders():
        if rows.get(folder) is not None:
            assert _package_of(folder) in packages, folder
