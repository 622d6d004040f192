"""Every tutorial-style script of tests/tutorial_scripts runs as its tutorial runs it, with
`torchrun`/`python` replaced by `kubeddp train` (tests/helpers/tutorials.py has the lines):
torchrun's positional form, a launch-era `--local_rank`, mp.spawn and mp.Process programs, a
tcp:// rendezvous and a MASTER_PORT of the program's own. Real processes (gloo, 2 workers or 2
spawned ones); each run has a network and a /tmp of its own, so the scripts' fixed ports and
files meet no other test. The runs go side by side."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import pytest

from tests.helpers import mounts, procs
from tests.helpers.tutorials import NOT_RUN, RUNS, SCRIPTS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
RUN_SECONDS = 420  # all side by side on a loaded 2-core machine


def test_every_script_is_run_or_says_why_not() -> None:
    assert sorted([*RUNS, *NOT_RUN]) == sorted(p.name for p in SCRIPTS.glob("*.py"))


def test_each_tutorial_script_runs_under_kubeddp_train(tmp_path: Path) -> None:
    runs = {}
    with contextlib.ExitStack() as stack:
        for name, run in RUNS.items():
            workdir = tmp_path / name.removesuffix(".py")
            workdir.mkdir()
            train = procs.kubeddp_argv("train", *run.train_argv(SCRIPTS / name))
            argv = mounts.alone(train, own_tmp=run.own_tmp)
            runs[name] = stack.enter_context(
                procs.started(argv, workdir / "train.log", cwd=workdir)
            )
        deadline = time.monotonic() + RUN_SECONDS
        codes = {
            name: proc.wait(max(1, deadline - time.monotonic())) for name, proc in runs.items()
        }
        failed = [
            f"{name} (exit {codes[name]}):\n{proc.tail(25)}"
            for name, proc in runs.items()
            if codes[name] != 0 or not re.search(RUNS[name].done, proc.output())
        ]
        assert not failed, "\n".join(failed)
        for proc in runs.values():
            assert "Traceback" not in proc.output() and "Warning" not in proc.output(), proc.tail()
            # DataLoader workers (no_set_epoch.py) are no program of its own starting workers
            assert "starts a process before it calls init_process_group" not in proc.output()


@pytest.mark.parametrize("name", sorted(NOT_RUN))
def test_scripts_not_run_say_why(name: str) -> None:
    pytest.skip(f"{name}: {NOT_RUN[name]}")
