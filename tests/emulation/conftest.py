"""Fixtures for the emulated cluster: root and `ip netns` are required; in CI they never skip."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cluster import EmulatedCluster  # noqa: E402


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces): run with sudo"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (Debian: iproute2, util-linux)"
    return ""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedCluster]:
    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"emulated cluster {why}; CI must run these tests")
        pytest.skip(why)
    emulated = EmulatedCluster(tmp_path / "cluster")
    try:
        yield emulated
    finally:
        emulated.close()
