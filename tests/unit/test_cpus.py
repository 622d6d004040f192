"""Intra-op threads per worker follow the pod's CPUs, not torchrun's blanket 1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubeddp.trainer.launcher.cpus import available_cpus, threads_per_worker


def _cpu_max(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpu.max"
    path.write_text(text)
    return path


def test_no_quota_means_the_affinity_mask(tmp_path: Path) -> None:
    mask = len(os.sched_getaffinity(0))
    assert available_cpus(_cpu_max(tmp_path, "max 100000\n")) == mask
    assert available_cpus(tmp_path / "missing") == mask


def test_a_quota_caps_the_count(tmp_path: Path) -> None:
    # 1.5 CPUs of quota: round up, never below 1, never above the affinity mask.
    assert available_cpus(_cpu_max(tmp_path, "150000 100000\n")) == min(
        2, len(os.sched_getaffinity(0))
    )
    assert available_cpus(_cpu_max(tmp_path, "1000 100000\n")) == 1


@pytest.mark.parametrize(
    ("nproc", "cpus", "expected"), [(2, 32, 16), (8, 4, 1), (3, 8, 2), (1, 1, 1)]
)
def test_threads_per_worker(nproc: int, cpus: int, expected: int) -> None:
    assert threads_per_worker(nproc, cpus) == expected
