"""Fixtures for the emulated cluster: root and `ip netns` are required; in CI they never skip."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., EmulatedCluster]]:
    """`cluster_factory(pod_security="restricted")`: a cluster made with these settings."""
    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"emulated cluster {why}; CI must run these tests")
        pytest.skip(why)
    made: list[EmulatedCluster] = []

    def make(**settings: Any) -> EmulatedCluster:
        made.append(EmulatedCluster(tmp_path / f"cluster{len(made)}", **settings))
        return made[-1]

    try:
        yield make
    finally:
        for emulated in made:
            emulated.close()


@pytest.fixture
def cluster(cluster_factory: Callable[..., EmulatedCluster]) -> EmulatedCluster:
    return cluster_factory()
