"""The `kubeddp` command line run in this process as a process would run it: its environment
only what the test gives (nothing of this machine's RANK, MASTER_ADDR... leaks in), its own
working directory, and its exit code, stdout and stderr. For tests of what a command plans,
prints or refuses, where the process boundary is not what they test: each such process cost
about 1.6 CPU-s of imports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import cluster_commands
from tests.helpers.procs import REPO

KEPT = ("PATH", "HOME")  # what a clean process environment keeps of this one


def run(
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`kubeddp ARGS` in this process, with `env` over PATH, HOME and the repository on
    PYTHONPATH, in `cwd` (the repository by default); both are put back after the test."""
    clean = {name: os.environ[name] for name in KEPT if name in os.environ}
    clean["PYTHONPATH"] = str(REPO)
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in {**clean, **(env or {})}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(cwd or REPO)
    capsys.readouterr()  # what the test printed before is not the command's
    code, out, err = cluster_commands.run(list(args), capsys)
    return subprocess.CompletedProcess(["kubeddp", *args], code, out, err)
