"""trainer/launcher/scratch.py: a launch's own scratch directories, and the sweep of those a
dead launch left (by pid and start time, on this host only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kubeddp.trainer.launcher import scratch

pytestmark = pytest.mark.timeout(60)
PREFIX = "kubeddp-unit-test-"


@pytest.fixture
def root(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(scratch.constants, "SCRATCH_DIR", str(tmp_path))
    return tmp_path


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_owned_dirs_name_host_pid_and_start(root: Path) -> None:
    made = scratch.owned_dir(PREFIX)
    start = scratch._start_time(os.getpid())
    assert made.parent == root
    assert made.name.startswith(f"{PREFIX}{scratch._host()}-{os.getpid()}-{start}-")
    assert scratch.sweep(PREFIX) == [] and made.exists(), "a live owner's directory stays"


def test_the_sweep_removes_only_dead_owners_of_this_host(root: Path) -> None:
    host = scratch._host()
    own_start = scratch._start_time(os.getpid())
    dead = root / f"{PREFIX}{host}-{_dead_pid()}-5-abc"
    reused = root / f"{PREFIX}{host}-{os.getpid()}-{own_start + 1}-abc"  # pid reused since
    live = root / f"{PREFIX}{host}-{os.getpid()}-{own_start}-abc"
    other_host = root / f"{PREFIX}elsewhere-{_dead_pid()}-5-abc"
    foreign = root / f"{PREFIX}not-ours"
    for directory in (dead, reused, live, other_host, foreign):
        directory.mkdir()
        (directory / "f").write_text("x")
    assert sorted(scratch.sweep(PREFIX)) == sorted([dead, reused])
    assert live.exists() and other_host.exists() and foreign.exists()
