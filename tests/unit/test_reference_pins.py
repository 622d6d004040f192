"""tests/fetch_reference.sh downloads what tests/reference/SOURCES.md lists: the same files,
from the same commits and paths, and the vendored copies under tests/reference have that sha256."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from tests.helpers.reference import REFERENCE_DIR, require

pytestmark = pytest.mark.timeout(30)
SCRIPT = Path(__file__).resolve().parents[1] / "fetch_reference.sh"
SOURCES = REFERENCE_DIR / "SOURCES.md"


def pins() -> dict[str, tuple[str, str, str]]:
    """local file -> (commit, upstream path, sha256) from the script."""
    found = re.findall(r'^  "([^"|]+)\|kubeflow/trainer\|([0-9a-f]{40})\|([^|]+)\|([0-9a-f]{64})"$',
                       SCRIPT.read_text(), re.MULTILINE)  # fmt: skip
    return {file: (commit, path, sha) for file, commit, path, sha in found}


def test_the_script_pins_every_crd_with_a_commit_and_a_sha256() -> None:
    assert len(pins()) == 5
    assert all(file.startswith("crds/") for file in pins())


def test_pins_match_sources_md() -> None:
    rows = {}
    for line in require(SOURCES).read_text().splitlines():
        cells = re.findall(r"`([^`]+)`", line)
        if line.startswith("| `crds/"):
            commit = next(c for c in cells if re.fullmatch(r"[0-9a-f]{40}", c))
            sha = [c for c in cells if re.fullmatch(r"[0-9a-f]{64}", c)][-1]
            rows[cells[0]] = (commit, cells[1], sha)
    assert rows == pins()


@pytest.mark.parametrize("file", sorted(pins()))
def test_local_copies_have_the_pinned_sha256(file: str) -> None:
    local = require(REFERENCE_DIR / file)
    assert hashlib.sha256(local.read_bytes()).hexdigest() == pins()[file][2]
