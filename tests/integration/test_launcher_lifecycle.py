"""The launcher's life and death with real processes: workers die with a launcher killed by
SIGKILL (and free the checkpoint directory), Ctrl-C saves and exits 130 without a traceback and
the next run resumes it exactly, and no run leaves temporary directories behind (a killed one's
are swept by the next).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
from pathlib import Path

import pytest

from kubeddp.trainer import constants, exit_codes
from kubeddp.trainer.launcher import scratch
from kubeddp.trainer.worker.checkpoint.lock import LOCK_FILE
from tests.helpers import checkpoints as ck
from tests.helpers import procs, workloads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SLOW = {workloads.DELAY_ENV: "0.002"}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lifecycle")


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for a reaper counts: it runs no code and holds no files)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _lock_is_free(directory: Path) -> bool:
    fd = os.open(directory / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except (BlockingIOError, PermissionError):
        return False
    finally:
        os.close(fd)


def test_workers_die_with_a_killed_launcher_and_free_the_directory(work: Path) -> None:
    ckpt_dir = work / "orphans"
    argv = ck.scenario_argv(ckpt_dir, "train.epochs=50")
    with procs.started(argv, work / "orphans.log", procs.child_env(SLOW)) as run:
        first = ckpt_dir / f"ckpt-{ck.SAVE_EVERY:08d}" / "COMPLETE"
        procs.wait_until(first.exists, 120, "the first checkpoint", run)
        workers = procs.torchrun_workers(run.pid)
        assert len(workers) == 2, workers
        assert not _lock_is_free(ckpt_dir), "rank 0 must hold the checkpoint directory"
        os.kill(run.pid, signal.SIGKILL)  # the launcher only, as the OOM killer would
        procs.wait_until(lambda: all(_gone(pid) for pid in workers.values()), 5, "workers gone")
        procs.wait_until(lambda: _lock_is_free(ckpt_dir), 5, "the lock to be released")


def _scratch_entries(pid: int) -> list[str]:
    """What launch `pid` made in the scratch directory (its metrics, torchrun and diagnostics
    dirs)."""
    host = scratch._host()
    owned = f"{host}-{pid}-"
    return [
        entry.name
        for entry in scratch.root().iterdir()
        if entry.name.startswith(
            (constants.METRICS_DIR_PREFIX, constants.RUN_DIR_PREFIX, constants.DIAG_DIR_PREFIX)
        )
        and owned in entry.name
    ]


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_ctrl_c_saves_exits_130_quietly_and_resumes_exactly(work: Path) -> None:
    baseline = ck.baseline_state(work)
    ckpt_dir = work / "ctrl-c"
    private_tmp = work / "tmpdir"
    private_tmp.mkdir()
    env = procs.child_env({**SLOW, "TMPDIR": str(private_tmp), "PYTHONUNBUFFERED": "1"})
    with procs.started(ck.scenario_argv(ckpt_dir), work / "ctrl-c.log", env) as run:
        first = ckpt_dir / f"ckpt-{10:08d}" / "COMPLETE"
        procs.wait_until(first.exists, 120, "the checkpoint of step 10", run)
        os.killpg(run.pid, signal.SIGINT)  # what a terminal sends to its foreground group
        code = run.wait(90)
    log = run.output()
    assert code == exit_codes.INTERRUPTED, run.tail()
    saved = run.wait_for_output(r"SIGINT: saving a checkpoint at step (\d+)", 1)
    assert ck.newest_state(ckpt_dir)["step"] == int(saved.group(1))
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, run.tail()
    assert not list(private_tmp.glob("torchelastic_*")), "torchrun's log dir was left behind"
    assert _scratch_entries(run.pid) == []

    done = procs.run(ck.scenario_argv(ckpt_dir), work / "ctrl-c-resume.log", timeout=150)
    assert done.code == 0, done.output[-4000:]
    final = ck.newest_state(ckpt_dir)
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)


def test_a_run_leaves_no_temporary_directories_and_sweeps_dead_ones(work: Path) -> None:
    private_tmp = work / "tmpdir-run"
    private_tmp.mkdir()
    host, dead = scratch._host(), _dead_pid()
    stale = [  # what a launch killed with SIGKILL leaves
        scratch.root() / f"{constants.METRICS_DIR_PREFIX}{host}-{dead}-1-abc{os.getpid()}",
        scratch.root() / f"{constants.RUN_DIR_PREFIX}{host}-{dead}-1-abc{os.getpid()}",
    ]
    alive = scratch.root() / f"{constants.METRICS_DIR_PREFIX}{host}-1-0-abc{os.getpid()}"
    try:
        for directory in (*stale, alive):
            directory.mkdir()
            (directory / "counter_1.db").write_bytes(b"\0" * 64)
        argv = procs.kubeddp_argv(
            "train", "--nproc", "2", "--set", "workload.name=regression",
            "--set", "train.max_steps=5", "--set", f"checkpoint.dir={work / 'short'}",
            "--set", "metrics.port=0",
        )  # fmt: skip
        env = procs.child_env({"TMPDIR": str(private_tmp)})
        with procs.started(argv, work / "short.log", env) as run:
            assert run.wait(120) == 0, run.tail()
        assert not list(private_tmp.glob("torchelastic_*")), "torchrun's log dir was left"
        assert _scratch_entries(run.pid) == [], "the run's own directories must go"
        assert not any(d.exists() for d in stale), "a dead launch's directories must be swept"
        assert alive.exists(), "a live process's directory (pid 1) must stay"
    finally:
        for directory in (*stale, alive):
            with contextlib.suppress(OSError):
                for child in directory.iterdir():
                    child.unlink()
                directory.rmdir()
