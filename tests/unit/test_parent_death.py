"""trainer/worker/parent_death.py with real processes: a worker dies with its launcher, also when
the launcher was gone before the worker could ask for that."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.process_contract import ENV_LAUNCHER_PID

pytestmark = pytest.mark.timeout(60)
WORKER = """
import os, sys, time
from kubeddp.trainer.worker.parent_death import die_with_launcher
armed = die_with_launcher()
print(f"armed={armed} env={os.environ.get('KUBEDDP_LAUNCHER_PID')}", flush=True)
time.sleep(60)
"""
# A launcher that starts the worker, prints its pid and then waits to be killed.
LAUNCHER = f"""
import os, subprocess, sys, time
os.environ["{ENV_LAUNCHER_PID}"] = str(os.getpid())
child = subprocess.Popen([sys.executable, "-c", {WORKER!r}], start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
def test_the_worker_dies_with_its_launcher() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    worker = int(launcher.stdout.readline())
    try:
        time.sleep(1.5)  # the worker imports and arms
        assert _alive(worker)
        launcher.kill()
        launcher.wait(10)
        end = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _alive(worker), "the worker outlived its launcher"
    finally:
        launcher.kill()
        if _alive(worker):
            os.kill(worker, 9)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
def test_a_worker_whose_launcher_is_already_gone_exits_at_once() -> None:
    # The launcher named in the env is not this process's parent: it died (and the worker was
    # re-parented) before the worker armed the signal.
    env = {**os.environ, ENV_LAUNCHER_PID: "999999999"}
    done = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == exit_codes.KILLED, done
    assert "the launcher is gone" in done.stderr


def test_the_variable_is_not_passed_on() -> None:
    env = {**os.environ, ENV_LAUNCHER_PID: str(os.getpid())}
    code = WORKER.replace("time.sleep(60)", "")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "env=None" in done.stdout
