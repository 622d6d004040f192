"""TrainJob progress from real 2-process gloo runs (`kubeddp train`, CPU) to a local HTTPS
stand-in of Kubeflow Trainer's status server that checks every request as Trainer does (path,
the projected token's audience and namespace, the v2.3.0 CRD's trainerStatus schema):

- the built-in trainer: the percentage climbs to 100, the remaining time falls to 0, steps,
  epochs, loss and eval loss are shown, and a token the kubelet rotates mid-run is read again;
- examples/ddp_train.py through kubeddp.api.report_step: the same from a user's script;
- a down endpoint, one that refuses the token (403), one that never answers: training ends as
  it would without them, with one warning line at most (that later tries are quiet, and a
  proxy's 401, are tests/unit/test_trainjob_status.py's).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kubeddp.trainer import constants
from tests.helpers import faults, procs, user_script
from tests.helpers import trainer_status_server as tss
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NS, NAME = "team", "tj"
RUN_SECONDS = 240
WARNING = "[kubeddp] warning: TrainJob progress"
# 900 training rows, 16 a rank a step on 2 ranks: 29 steps an epoch, 2 epochs; each forward
# sleeps 40 ms, so the run spans several posts (one a second here).
BUILT_IN = [
    "train", "--nproc", "2", *faults.settings("slow", -1, 0, samples=1000, work_ms=40),
    "--set", "train.epochs=2", "--set", "train.batch_size=16", "--set", "train.log_every=5",
    "--set", "train.eval_batches=2", "--set", "ddp.backend=gloo", "--set", "ddp.device=cpu",
    "--set", "metrics.port=0",
]  # fmt: skip


def trainer_env(server: tss.TrainerStatusServer, folder: Path) -> dict[str, str]:
    """What the controller injects (token and CA in `folder`), posting every second."""
    tss.pod_files(server, folder, NS, NAME)
    env = tss.pod_env(server, folder, NS, NAME)
    return procs.child_env({**env, constants.ENV_TRAINER_STATUS_SECONDS: "1"})


def metrics_of(status: dict) -> dict[str, str]:
    return {m["name"]: m["value"] for m in status.get("metrics", [])}


def assert_progress_climbed(statuses: list[dict]) -> dict[str, str]:
    """Several posts, the percentage never falling and ending at 100; the last metrics."""
    assert len(statuses) >= 2, statuses
    percents = [s["progressPercentage"] for s in statuses]
    assert percents == sorted(percents) and percents[-1] == 100, percents
    assert len(set(percents)) >= 2, f"no progress between posts: {percents}"
    assert statuses[-1]["estimatedRemainingSeconds"] == 0, statuses[-1]
    times = [s["lastUpdatedTime"] for s in statuses]
    assert times == sorted(times), times
    final = metrics_of(statuses[-1])
    assert final["step"] == final["total_steps"], final
    return final


def test_the_built_in_trainer_fills_the_status_and_follows_a_rotated_token(
    tmp_path: Path,
) -> None:
    with tss.running(tmp_path / "tls", {(NS, NAME)}) as server:
        env = trainer_env(server, tmp_path / "pod")
        argv = procs.kubeddp_argv(*BUILT_IN, "--set", f"checkpoint.dir={tmp_path / 'ck'}")
        with procs.started(argv, tmp_path / "run.log", env) as run:
            procs.wait_until(lambda: server.statuses(NS, NAME), 120, "a first status", run)
            rotated = server.credentials.token(NS, NAME, expires_in=1800)
            (tmp_path / "pod" / "token").write_text(rotated)
            assert run.wait(RUN_SECONDS) == 0, run.tail()
            output = run.output()
    assert all(r.answered == 200 for r in server.requests), [r.answered for r in server.requests]
    assert server.requests[-1].authorization == f"Bearer {rotated}", "the token was not re-read"
    final = assert_progress_climbed(server.statuses(NS, NAME))
    assert (final["step"], final["epoch"], final["total_epochs"]) == ("58", "1", "2"), final
    # the loss of the last log line (the mean of its interval, as kubeddp_loss), the val loss
    # of the closing line
    last_line = re.search(r"^step 58/58 \| epoch 1 \| loss ([0-9.]+)", output, re.MULTILINE)
    done = re.search(r"^done: .* val loss ([0-9.]+)", output, re.MULTILINE)
    assert last_line and done, output[-2000:]
    assert float(final["loss"]) == pytest.approx(float(last_line.group(1)), abs=1e-4)
    assert float(final["eval_loss"]) == pytest.approx(float(done.group(1)), abs=1e-4)
    assert WARNING not in output


def test_a_script_reporting_steps_fills_the_status(tmp_path: Path) -> None:
    """examples/ddp_train.py passes its total steps and epochs to report_step."""
    with tss.running(tmp_path / "tls", {(NS, NAME)}) as server:
        env = trainer_env(server, tmp_path / "pod")
        argv = procs.kubeddp_argv(
            "train", "--nproc", "2", "--set", "metrics.port=0", "--script",
            str(user_script.SCRIPT), *user_script.ARGS, "--pause", "0.1",
            "--snapshot", str(tmp_path / "snapshot.pt"),
        )  # fmt: skip
        done = procs.run(argv, tmp_path / "run.log", RUN_SECONDS, env)
    assert done.code == 0, done.output[-3000:]
    final = assert_progress_climbed(server.statuses(NS, NAME))
    steps = user_script.DIGEST.search(done.output)
    assert steps and final["step"] == steps.group(1), final
    assert (final["epoch"], final["total_epochs"]) == ("1", "2"), final
    assert float(final["loss"]) >= 0
    assert WARNING not in done.output


@pytest.mark.parametrize("endpoint", ["down", "another job's token", "hanging"])
def test_a_broken_endpoint_never_touches_training(tmp_path: Path, endpoint: str) -> None:
    with tss.running(tmp_path / "tls", {(NS, NAME)}) as server:
        env = trainer_env(server, tmp_path / "pod")
        if endpoint == "down":
            url = env[tss.ENV_URL].replace(f":{server.port}/", f":{free_port()}/")
            env[tss.ENV_URL] = url
        elif endpoint == "another job's token":
            (tmp_path / "pod" / "token").write_text(server.credentials.token(NS, "other"))
        else:
            server.hang()
        argv = procs.kubeddp_argv(*BUILT_IN, "--set", f"checkpoint.dir={tmp_path / 'ck'}")
        done = procs.run(argv, tmp_path / "run.log", RUN_SECONDS, env)
    assert done.code == 0, done.output[-3000:]
    assert re.search(r"^done: 58 steps", done.output, re.MULTILINE), done.output[-2000:]
    lines = [line for line in done.output.splitlines() if WARNING in line]
    assert len(lines) == 1, lines
    said = {"down": "ConnectionRefusedError", "another job's token": "HTTP 403: Forbidden",
            "hanging": "timed out|did not end within 5 s"}[endpoint]  # fmt: skip
    assert re.search(said, lines[0]), lines
    assert server.statuses(NS, NAME) == []
