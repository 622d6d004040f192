"""TensorBoard curves (worker/curves.py) as TensorBoard itself reads them back: a run killed
after a checkpoint and resumed shows each step once (each worker generation's file starts with
the purge marker at its first step); without the tensorboard package one line and nothing
else; an object store gets the event files through the checkpoint backend (moto's S3 server)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from kubeddp.trainer.config import load_config
from kubeddp.trainer.process_contract import resolved_config_env
from kubeddp.trainer.worker.curves import Curves, resolve_target
from tests.helpers import s3server

pytestmark = pytest.mark.timeout(120)


def read_back(directory: Path) -> EventAccumulator:
    """TensorBoard's own loader over a run directory (its default: orphaned points purged)."""
    accumulator = EventAccumulator(str(directory))
    accumulator.Reload()
    return accumulator


def steps_written(directory: Path, tag: str) -> list[int]:
    """Every point of `tag` in every event file, as written (no purge)."""
    return [
        event.step
        for path in sorted(directory.glob("events.out.tfevents.*"))
        for event in EventFileLoader(str(path)).Load()
        for value in event.summary.value
        if value.tag == tag
    ]


def generation(curves: Curves, steps: range, log_every: int, loss: float) -> None:
    """One worker generation of the built-in trainer: a loss on its log steps."""
    for step in steps:
        curves.on_step(step, loss=loss if step % log_every == 0 else None, lr=0.1,
                       samples=64, step_seconds=0.05)  # fmt: skip
        if step == 20:
            curves.on_eval(step, loss + 0.5)
            curves.on_checkpoint()  # the checkpoint the next generation resumes from


def test_a_resumed_run_shows_each_step_once(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    lines: list[str] = []
    first = Curves("auto", str(ckpt), True, lines.append)
    generation(first, range(1, 36), 10, loss=1.0)
    first.writer.flush()  # the killed generation's periodic flush got steps 21-35 to disk
    first.writer = None  # killed: never closed
    second = Curves("auto", str(ckpt), True, lines.append)
    generation(second, range(21, 51), 10, loss=2.0)  # resumed from the checkpoint of step 20
    second.close()
    assert not lines, lines
    run = ckpt / "tensorboard"
    assert steps_written(run, "train/loss") == [10, 20, 30, 30, 40, 50]  # 30: in both files
    board = read_back(run)
    losses = board.Scalars("train/loss")
    assert [(p.step, p.value) for p in losses] == [(10, 1.0), (20, 1.0), (30, 2.0), (40, 2.0),
                                                   (50, 2.0)]  # fmt: skip
    assert [p.step for p in board.Scalars("eval/loss")] == [20]
    rates = board.Scalars("train/samples_per_second")
    assert [p.step for p in rates] == [10, 20, 30, 40, 50]
    assert rates[0].value == pytest.approx(64 / 0.05)  # the warm-up step left out
    assert {"train/learning_rate", "train/step_seconds"} <= set(board.Tags()["scalars"])


def test_where_the_curves_go() -> None:
    assert resolve_target("auto", "/checkpoints/") == "/checkpoints/tensorboard"
    assert resolve_target("auto", "s3://b/run") == "s3://b/run/tensorboard"
    assert resolve_target("auto", "") == ""  # not the root's /tensorboard
    assert resolve_target("off", "/checkpoints") == ""
    assert resolve_target("/tb/run-7", "/checkpoints") == "/tb/run-7"


def test_other_ranks_and_off_write_nothing(tmp_path: Path) -> None:
    for curves in (Curves("auto", str(tmp_path), False, print), Curves("off", str(tmp_path), True,
                                                                        print)):  # fmt: skip
        curves.on_step(10, loss=1.0, lr=0.1, samples=1, step_seconds=0.1)
        curves.close()
    assert not list(tmp_path.iterdir())


def test_without_tensorboard_one_line_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as where it is not installed
    lines: list[str] = []
    curves = Curves("auto", str(tmp_path / "ckpt"), True, lines.append)
    curves.on_step(10, loss=1.0, lr=0.1, samples=1, step_seconds=0.1)
    curves.close()
    assert lines == [
        "[kubeddp] TensorBoard curves off: the tensorboard package is not installed "
        "(pip install 'kubeddp[tensorboard]', or set metrics.tensorboard=off)"
    ]
    assert not (tmp_path / "ckpt").exists()


def test_a_directory_it_cannot_write_is_one_warning(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    lines: list[str] = []
    curves = Curves(str(tmp_path / "file" / "tb"), "", True, lines.append)
    curves.on_step(10, loss=1.0, lr=0.1, samples=1, step_seconds=0.1)
    curves.on_step(20, loss=1.0, lr=0.1, samples=1, step_seconds=0.1)
    curves.close()
    assert len(lines) == 1 and lines[0].startswith(
        f"[kubeddp] warning: TensorBoard curves off: cannot write to {tmp_path / 'file' / 'tb'}"
    ), lines


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.S3Server]:
    with s3server.started(tmp_path_factory.mktemp("s3")) as running:
        yield running


def test_an_object_store_gets_the_event_files(
    server: s3server.S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    url = f"s3://{s3server.BUCKET}/curves/run"
    lines: list[str] = []
    curves = Curves("auto", url, True, lines.append)
    generation(curves, range(1, 31), 10, loss=1.0)
    curves.close()
    assert not lines, lines
    keys = server.keys("curves/run/")
    assert keys and all(k.startswith("curves/run/tensorboard/events.out.tfevents.") for k in keys)
    local = tmp_path / "downloaded"
    local.mkdir()
    for key in keys:
        server.client().download_file(s3server.BUCKET, key, str(local / key.rsplit("/", 1)[1]))
    assert [p.step for p in read_back(local).Scalars("train/loss")] == [10, 20, 30]


REPORTING = textwrap.dedent(
    """
    from kubeddp import api
    for step in range(1, 6):
        api.report_step(step, samples=8, loss=1.0 / step,
                        metrics={"eval_loss": 0.5, "accuracy": 0.9, "note": "text"})
    """
)


def test_report_step_draws_rank_0s_curves(tmp_path: Path) -> None:
    """A user's program under kubeddp launch (its resolved config in the environment): rank 0's
    report_step calls become points, at most ten a second, the last one at exit."""
    cfg = load_config(None, [f"checkpoint.dir={tmp_path / 'ckpt'}"])
    env = {**os.environ, **resolved_config_env(cfg), "RANK": "0", "WORLD_SIZE": "2"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # curves do not need /metrics
    done = subprocess.run([sys.executable, "-c", REPORTING], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr
    board = read_back(tmp_path / "ckpt" / "tensorboard")
    losses = board.Scalars("train/loss")
    assert [p.step for p in losses] == [1, 5]  # the first call, then the rest at exit
    assert losses[1].value == pytest.approx((1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 4)
    assert [p.step for p in board.Scalars("eval/loss")] == [1, 5]
    assert [p.value for p in board.Scalars("accuracy")] == pytest.approx([0.9, 0.9])
    assert "note" not in board.Tags()["scalars"]  # a string metric is the TrainJob's only
    rates = board.Scalars("train/samples_per_second")
    assert [p.step for p in rates] == [5]  # the first call has no time before it
