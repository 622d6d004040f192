"""The user-program runner's exit paths, real processes:

- a worker that fails makes torchrun's agent stop its healthy peers: they end quietly, and one
  launcher line names the worker that failed first; the failed program's atexit handlers ran;
- a worker stuck in native code (a gloo init whose peer never comes) cannot run its SIGTERM
  handler: it is ended with 143 once that is known, not after the grace period (600 s here).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.config import load_config
from kubeddp.trainer.process_contract import ENV_LAUNCHER_PID, resolved_config_env
from kubeddp.trainer.worker.program import RUNNER_MODULE
from tests.helpers import procs
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ONE_FAILS = """import atexit, os, sys, time
rank = int(os.environ["LOCAL_RANK"])
atexit.register(lambda: print(f"atexit of rank {rank}", flush=True))
print(f"rank {rank} started", flush=True)
if rank == 1:
    time.sleep(0.5)
    sys.exit(3)
time.sleep(120)
"""
STUCK = """import datetime
import torch.distributed as dist
{poll}
port = {port}
print("ready", flush=True)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=0, world_size=2,
                        timeout=datetime.timedelta(seconds=240))
"""
POLL = "from kubeddp import api\napi.stop_requested()"
GRACE = 600  # the agent would wait this (+10 s) for a worker that never reacts


def test_peer_failure_leaves_healthy_workers_quiet_and_names_the_first(tmp_path: Path) -> None:
    (tmp_path / "one_fails.py").write_text(ONE_FAILS)
    done = procs.run(
        procs.kubeddp_argv("train", "--nproc", "2", "--set", "metrics.port=0",
                           "--script", str(tmp_path / "one_fails.py")),
        tmp_path / "run.log",
        120,
    )  # fmt: skip
    assert done.code == 3, done.output[-3000:]
    assert "exit code 3 (fatal); local rank 1 (pid " in done.output, done.output[-3000:]
    assert "failed first" in done.output
    assert "atexit of rank 1" in done.output  # sys.exit(3) ran the program's atexit handlers
    assert "[kubeddp] SIGTERM" not in done.output, done.output[-3000:]  # rank 0: quiet


@pytest.mark.parametrize("polls", [False, True], ids=["never-polls", "polls"])
def test_worker_stuck_in_native_code_is_ended_on_sigterm(tmp_path: Path, polls: bool) -> None:
    (tmp_path / "stuck.py").write_text(STUCK.format(poll=POLL if polls else "", port=free_port()))
    cfg = load_config(None, [f"checkpoint.preempt_grace_seconds={GRACE}"])
    env = procs.child_env(resolved_config_env(cfg))
    env.pop(ENV_LAUNCHER_PID, None)
    argv = [sys.executable, "-m", RUNNER_MODULE, "script", str(tmp_path / "stuck.py")]
    with procs.started(argv, tmp_path / "stuck.log", env) as run:
        run.wait_for_output(r"^ready$", 60)
        run.send_signal(signal.SIGTERM)
        code = run.wait(60)  # far less than GRACE: the worker did not wait for its grace
    assert code == exit_codes.PREEMPTED, run.tail()
    assert "in native code" in run.output() and "cannot save" in run.output(), run.tail()


FORKS = """import multiprocessing, time
child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
child.start()
time.sleep(0.5)
child.terminate()  # what a DataLoader does to a worker that does not stop in time
child.join()
time.sleep(3)  # the watcher, had it taken the child's SIGTERM for this process's, ends it here
print("parent alive", flush=True)
"""


def test_sigterm_to_a_forked_child_does_not_end_the_program(tmp_path: Path) -> None:
    (tmp_path / "forks.py").write_text(FORKS)
    env = procs.child_env()
    env.pop(ENV_LAUNCHER_PID, None)
    argv = [sys.executable, "-m", RUNNER_MODULE, "script", str(tmp_path / "forks.py")]
    done = procs.run(argv, tmp_path / "forks.log", 60, env)
    assert done.code == 0, done.output
    assert "parent alive" in done.output and "native code" not in done.output
