"""A pod that starts after its run finished exits 0 at once (trainer/launcher/finished_run.py).

Two real Indexed-Job "pods" (kubeddp launch processes with the env the chart gives, on
loopback, one shared checkpoint dir) train to the end. Then index 1 starts again, as the Job
controller starts a pod that was lost in the run's last seconds: its peer is gone, and instead
of waiting for a rendezvous no one joins, it exits 0 with one line. With another config it is a
new run: it waits for its peer as before.

A pod lost after its training ended but before the final barrier leaves no record: its peer's
barrier fails, and that pod ends with the retryable PEER_FAILED as after a failed step (never
the fatal TRAINING_FAILED, which a TrainJob's podFailurePolicy turns into a failed job).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeddp.trainer import constants, exit_codes
from kubeddp.trainer.launcher.finished_run import RECORD_NAME
from kubeddp.trainer.launcher.retry_budget import RECORD_DIR
from tests.helpers import faults, procs
from tests.helpers.pod_env import loopback_indexedjob_pod
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
RUN_SECONDS = 200
RDZV_WAIT_SECONDS = 20


def pod_env(index: int, port: int) -> dict[str, str]:
    """An Indexed Job pod of a 2-node job, as `kubeddp render indexedjob` writes it."""
    return procs.child_env({
        **loopback_indexedjob_pod(index, port),
        # Long enough for both pods to start on a loaded machine (they start together here).
        constants.ENV_RDZV_WAIT_SECONDS: str(RDZV_WAIT_SECONDS),
    })  # fmt: skip


def launch_argv(checkpoints: Path, *extra: str) -> list[str]:
    return procs.kubeddp_argv(
        "launch", "--",
        "--set", "workload.name=regression", "--set", "train.max_steps=4",
        "--set", "train.log_every=2", "--set", "train.eval_batches=1",
        "--set", "ddp.backend=gloo", "--set", "ddp.device=cpu",
        "--set", "metrics.enabled=false", "--set", f"checkpoint.dir={checkpoints}",
        *extra,
    )  # fmt: skip


def test_a_pod_started_after_its_run_finished_exits_0_at_once(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    port = free_port()
    argv = launch_argv(checkpoints)
    with (
        procs.started(argv, tmp_path / "pod0.log", pod_env(0, port)) as pod0,
        procs.started(argv, tmp_path / "pod1.log", pod_env(1, port)) as pod1,
    ):
        assert pod0.wait(RUN_SECONDS) == 0, pod0.output()[-3000:]
        assert pod1.wait(RUN_SECONDS) == 0, pod1.output()[-3000:]
        assert "done: 4 steps" in pod0.output()
    assert (checkpoints / RECORD_DIR / RECORD_NAME).is_file()

    # Index 1 again, its peer gone: no wait for 127.0.0.1:port, no training.
    again = procs.run(argv, tmp_path / "again.log", RUN_SECONDS, pod_env(1, port))
    assert again.code == exit_codes.OK, again.output[-3000:]
    assert "this run already finished" in again.output
    assert "waiting up to" not in again.output and "done:" not in again.output

    # Another config is another run: it waits for its peer (RDZV_WAIT_SECONDS) as before.
    changed = launch_argv(checkpoints, "--set", "train.max_steps=6")
    other = procs.run(changed, tmp_path / "other.log", RUN_SECONDS, pod_env(1, port))
    assert other.code == exit_codes.RDZV_UNREACHABLE, other.output[-3000:]
    assert "already finished" not in other.output


def test_a_pod_lost_before_the_final_barrier_leaves_its_peer_retrying(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    port = free_port()
    argv = launch_argv(checkpoints, *faults.settings("die_at_teardown", 1, 0, samples=512))
    with (
        procs.started(argv, tmp_path / "pod0.log", pod_env(0, port)) as pod0,
        procs.started(argv, tmp_path / "pod1.log", pod_env(1, port)) as pod1,
    ):
        assert pod1.wait(RUN_SECONDS) == exit_codes.KILLED, pod1.output()[-3000:]
        code0 = pod0.wait(RUN_SECONDS)
    out0 = pod0.output()
    assert "done: 4 steps" in out0, out0[-3000:]  # rank 0 finished training, then lost rank 1
    survivor = f"exit code {exit_codes.describe(exit_codes.PEER_FAILED)}"
    assert any(line.startswith("kubeddp: error (rank 0):") and line.endswith(survivor)
               for line in out0.splitlines()), out0[-3000:]  # fmt: skip
    # the pod stays up to rejoin; its peer gone for good, it ends retryable (200 here)
    assert code0 >= exit_codes.RETRYABLE_FROM, out0[-3000:]
    assert "Traceback" not in out0 and "[kubeddp] finished" not in out0, out0[-3000:]
    assert not (checkpoints / RECORD_DIR / RECORD_NAME).exists()


PROGRAM = "print('program says {word}', flush=True)\n"


def test_an_edited_program_at_the_same_path_is_another_run(tmp_path: Path) -> None:
    """A one-pod job of a user's script: started again after it finished, the pod exits 0 at
    once; with the script edited (same path, same arguments, as a new image would bring it)
    the pod runs it."""
    checkpoints, script = tmp_path / "checkpoints", tmp_path / "train.py"
    config = tmp_path / "config.yaml"
    config.write_text(f"checkpoint:\n  dir: {checkpoints}\nmetrics:\n  enabled: false\n")
    script.write_text(PROGRAM.format(word="one"))
    argv = procs.kubeddp_argv(
        "launch", "--config", str(config), "--script", str(script), "--", "--epochs", "1"
    )
    env = {**pod_env(0, free_port()), "KUBEDDP_NNODES": "1"}
    first = procs.run(argv, tmp_path / "first.log", RUN_SECONDS, env)
    assert first.code == exit_codes.OK and "program says one" in first.output, first.output
    again = procs.run(argv, tmp_path / "again.log", RUN_SECONDS, env)
    assert again.code == exit_codes.OK and "this run already finished" in again.output
    assert "program says" not in again.output, again.output
    script.write_text(PROGRAM.format(word="two"))
    edited = procs.run(argv, tmp_path / "edited.log", RUN_SECONDS, env)
    assert edited.code == exit_codes.OK and "program says two" in edited.output, edited.output
    assert "already finished" not in edited.output
