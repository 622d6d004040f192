"""The keeper's benchmark on a tiny size, so `make bench` does not rot: every row is measured
and well formed, and the 8-pod rows count exactly what went through the keeper. No timing is
asserted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.bench.bench_keeper import PODS, bench_keeper


@pytest.mark.timeout(600)
def test_the_keeper_bench_measures_every_row(tmp_path: Path) -> None:
    rows = bench_keeper(tmp_path, [8], reps=1, pods_mib=2)
    assert [row.name.split(":")[0] for row in rows] == [
        "push of a 8 MiB checkpoint",
        "fetch of a 8 MiB checkpoint",
        f"{PODS} pods starting at once, 1 reading",
        f"{PODS} pods starting at once, {PODS} reading",
    ]
    for row in rows:
        assert row.ratio is not None and math.isfinite(row.ratio) and row.ratio > 0, row
    for row in rows[2:]:  # only the readers fetch it, once each
        assert row.ratio == 1.0 and row.extra["moved"] == row.extra["readers"] * row.extra["size"]
    assert not (tmp_path / "keeper").exists()  # its gigabytes are removed
