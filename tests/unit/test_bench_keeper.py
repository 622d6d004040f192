"""The keeper's benchmark on a tiny size, so `make bench` does not rot: every row is measured
and well formed, the 8-pod rows count exactly what went through the keeper, and a comparison
that fails loses none of the rows measured before it. No timing is asserted."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import pytest

from tests.bench.bench_keeper import PODS, bench_keeper
from tests.bench.common import Row
from tests.bench.report import disagreement


@pytest.mark.timeout(600)
def test_the_keeper_bench_measures_every_row(tmp_path: Path, monkeypatch) -> None:
    # an rsync that fails as a broken or refused daemon would: its row says so, nothing is lost
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "rsync").write_text("#!/bin/sh\necho 'rsync: failed to bind: refused' >&2\nexit 10\n")
    (fake / "rsync").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    emitted: list[Row] = []
    rows = bench_keeper(tmp_path, [8], reps=1, pods_mib=2, rsync=True, emit=emitted.append)
    assert emitted == rows  # each handed out as it was measured
    assert [row.name.split(":")[0] for row in rows] == [
        "push of a 8 MiB checkpoint",
        "fetch of a 8 MiB checkpoint",
        f"{PODS} pods starting at once, 1 reading",
        f"{PODS} pods starting at once, {PODS} reading",
        "rsync daemon push",
    ]
    for row in rows[:4]:
        assert row.ratio is not None and math.isfinite(row.ratio) and row.ratio > 0, row
    for row in rows[:2]:  # against the TCP copy; cp + fsync beside it; CPU per GiB on each side
        assert set(row.extra["ratios_by_arm"]) >= {"tcp", "cp"}, row.extra
        assert disagreement(row) == "" and "MB/s (the median pair)" in row.absolute
        assert "keeper / cp + fsync" in row.note
        for key in ("keeper.pod", "keeper.keeper", "tcp.sender", "tcp.receiver", "cp.cp"):
            assert all(math.isfinite(v) and v >= 0 for v in row.extra["cpu_s_per_gib"][key])
    assert "tcp-no-fsync" in rows[1].extra["ratios_by_arm"]  # the fetch does not fsync: shown too
    for row in rows[2:4]:  # only the readers fetch it, once each
        assert row.ratio == 1.0 and row.extra["moved"] == row.extra["readers"] * row.extra["size"]
    assert rows[4].ratio is None and "rsync daemon did not listen" in rows[4].note, rows[4]
    assert not (tmp_path / "keeper").exists()  # its gigabytes are removed
