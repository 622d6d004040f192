"""A stalled rank is named, with the frame it is stuck in, before anything is killed; then the
job follows diagnostics.on_stall. Real processes, gloo, two ranks; small stall_seconds.

The report's own figure says how long the rank had been idle when it was captured: it must be
under stall_seconds + 10 s (the issue's bound; the watch looks every stall_seconds / 10).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from kubeddp.trainer import constants, exit_codes
from tests.helpers import faults, procs

# alone: a healthy rank idle for STALL_SECONDS would be named too
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(400)]

STALL_SECONDS = 3
SCRIPT = procs.REPO / "tests" / "helpers" / "fault_script.py"
LINE = re.compile(r"^\[kubeddp\] stall: (rank (\d+) .* for (\d+) s.*)$", re.MULTILINE)


def _trainer_argv(tmp: Path, fault: str, rank: int, step: int, *sets: str) -> list[str]:
    argv = procs.kubeddp_argv("train", "--nproc", "2")
    argv += faults.settings(fault, rank, step, batch_size=16)
    for item in (
        "train.batch_size=16",
        f"checkpoint.dir={tmp / 'ckpt'}",
        "metrics.port=0",
        f"diagnostics.stall_seconds={STALL_SECONDS}",
        *sets,
    ):
        argv += ["--set", item]
    return argv


def _script_argv(tmp: Path, action: str, *script_args: str) -> list[str]:
    argv = procs.kubeddp_argv("train", "--nproc", "2")
    for item in (
        "metrics.port=0",
        f"diagnostics.stall_seconds={STALL_SECONDS}",
        f"diagnostics.on_stall={action}",
        f"diagnostics.report_dir={tmp / 'reports'}",
    ):
        argv += ["--set", item]
    return [*argv, "--script", str(SCRIPT), "--", *script_args]


def _env(tmp: Path) -> dict[str, str]:
    termination = tmp / "termination-log"
    termination.write_text("")
    return procs.child_env({constants.ENV_TERMINATION_LOG: str(termination)})


def _check_line(output: str, rank: int, frame: str) -> str:
    found = LINE.search(output)
    assert found, f"no stall line\n{output[-4000:]}"
    line, named, idle = found.group(1), int(found.group(2)), int(found.group(3))
    assert named == rank, line
    assert frame in line, line
    assert idle < STALL_SECONDS + 10, line
    return line


def _check_exit(run: procs.Proc, tmp: Path, rank: int, frame: str) -> None:
    code = run.wait(240)  # a loaded machine may take a minute to start the workers
    output = run.output()
    line = _check_line(output, rank, frame)
    assert code == exit_codes.STALLED, run.tail()
    # The full report: in the log between the markers, and in the report directory.
    report = output.split("---- stall report begin ----", 1)[1].split("---- stall report end")[0]
    assert frame in report and "most recent call first" in report, report
    saved = re.search(r"full report: (\S+)\)", line)
    assert saved and frame in Path(saved.group(1)).read_text()
    assert (tmp / "termination-log").read_text().startswith("[kubeddp] stall: rank")


def test_a_rank_asleep_in_its_data_loader_is_named_and_the_pod_exits_retryable(
    tmp_path: Path,
) -> None:
    argv = _trainer_argv(tmp_path, "sleep_data", 1, 5)
    with procs.started(argv, tmp_path / "run.log", _env(tmp_path)) as run:
        _check_exit(run, tmp_path, 1, "sleep_in_data_loader")
    line = _check_line(run.output(), 1, "data")
    assert "1 rank waits in the gradient all-reduce" in line, line


def test_a_deadlocked_rank_is_named_and_the_job_waits_when_told_to(tmp_path: Path) -> None:
    argv = _trainer_argv(tmp_path, "deadlock", 0, 4, "diagnostics.on_stall=wait")
    with procs.started(argv, tmp_path / "run.log", _env(tmp_path)) as run:
        procs.wait_until(lambda: LINE.search(run.output()), 240, "a stall line", run)
        _check_line(run.output(), 0, "deadlock")
        # on_stall=wait: the workers are left alone and the stall is reported once
        workers = procs.torchrun_workers(run.pid)
        time.sleep(STALL_SECONDS)
        assert run.poll() is None, run.tail()
        assert workers == procs.torchrun_workers(run.pid), run.tail()
        assert len(LINE.findall(run.output())) == 1, run.tail()
        # every thread's stack: the stuck main thread, and the partner holding the other lock
        stacks = run.output()
        assert " in deadlock" in stacks and " in other" in stacks, run.tail(80)


@pytest.mark.parametrize(
    ("fault", "report", "frame"),
    [
        ("sleep_data", False, "sleep_in_data_loader"),
        ("skip_allreduce", True, "started 4 collectives, the others 5"),
    ],
)
def test_a_user_script_stall_is_named_with_and_without_report_step(
    tmp_path: Path, fault: str, report: bool, frame: str
) -> None:
    args = ["--fault", fault, "--rank", "1", "--step", "5", *(["--report"] if report else [])]
    argv = _script_argv(tmp_path, "exit", *args)
    with procs.started(argv, tmp_path / "run.log", _env(tmp_path)) as run:
        _check_exit(run, tmp_path, 1, frame)


def test_a_deadlocked_user_script_is_named(tmp_path: Path) -> None:
    argv = _script_argv(tmp_path, "exit", "--fault", "deadlock", "--rank", "0", "--step", "6")
    with procs.started(argv, tmp_path / "run.log", _env(tmp_path)) as run:
        _check_exit(run, tmp_path, 0, "deadlock")
