"""Checkpoint directories a run must not trust or share, with real processes: a checkpoint that
unpickles but holds the wrong content, a resume with another train.seed, a checkpoint.dir that
is a file, and a second run on a directory another run is writing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kubeddp.trainer import exit_codes
from tests.helpers import checkpoints as ck
from tests.helpers import procs, workloads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ckpt-faults")


def error_lines(output: str) -> list[str]:
    assert "Traceback" not in output, output[-4000:]
    return [line for line in output.splitlines() if line.startswith("kubeddp") and "error" in line]


def test_wrong_content_is_set_aside_and_the_previous_one_resumed(work: Path) -> None:
    baseline = ck.baseline_state(work)
    ckpt_dir = work / "wrong-content"
    shutil.copytree(ck.baseline_dir(work), ckpt_dir)
    steps = ck.steps(ckpt_dir)
    newest, previous = ckpt_dir / f"ckpt-{steps[-1]:08d}", ckpt_dir / f"ckpt-{steps[-2]:08d}"
    ck.replace_state(newest, torch.zeros(3))  # unpickles fine, passes its digests; not a checkpoint

    done = procs.run(ck.scenario_argv(ckpt_dir), work / "wrong-content.log", timeout=150)
    assert done.code == 0, done.output[-4000:]
    assert f"checkpoint {newest} holds the wrong content" in done.output
    assert f"resumed from {previous}" in done.output
    kept = newest.with_name(newest.name + ".bad")
    assert torch.equal(torch.load(kept / "state.pt"), torch.zeros(3)), "the bad one is kept"
    final = ck.newest_state(ckpt_dir)
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)


def test_resuming_with_another_seed_is_refused_in_one_line(work: Path) -> None:
    ckpt_dir = work / "other-seed"
    shutil.copytree(ck.baseline_dir(work), ckpt_dir)
    before = ck.steps(ckpt_dir)
    argv = ck.scenario_argv(ckpt_dir, "train.seed=99", nproc=1)
    done = procs.run(argv, work / "other-seed.log", timeout=120)
    assert done.code == exit_codes.BAD_INPUT, done.output[-4000:]
    (line,) = error_lines(done.output)
    assert "train.seed=1234" in line and "train.seed=99" in line and str(ckpt_dir) in line
    assert ck.steps(ckpt_dir) == before, "a refused resume must not touch the checkpoints"


def test_checkpoint_dir_that_is_a_file_fails_at_start(work: Path) -> None:
    blocker = work / "a-file"
    blocker.write_text("not a directory")
    argv = procs.kubeddp_argv(
        "train", "--nproc", "2", "--set", "workload.name=regression",
        "--set", f"checkpoint.dir={blocker}", "--set", "metrics.port=0",
    )  # fmt: skip
    done = procs.run(argv, work / "a-file.log", timeout=120)
    assert done.code == exit_codes.BAD_INPUT, done.output[-4000:]
    lines = error_lines(done.output)
    assert len(lines) == 2 and all(f"checkpoint.dir {blocker} is a file" in x for x in lines)
    assert "step 1" not in done.output, "nothing may train without a place for checkpoints"


def test_a_second_run_on_a_directory_in_use_fails_at_start(work: Path) -> None:
    ckpt_dir = work / "shared"
    first = ck.scenario_argv(ckpt_dir, "train.epochs=50")
    slow = procs.child_env({workloads.DELAY_ENV: "0.002"})
    with procs.started(first, work / "first.log", slow) as run:
        procs.wait_until((ckpt_dir / f"ckpt-{ck.SAVE_EVERY:08d}").exists, 120, "a save", run)
        second = procs.run(ck.scenario_argv(ckpt_dir), work / "second.log", timeout=120)
        assert run.poll() is None, "the first run must go on"
    assert second.code == exit_codes.BAD_INPUT, second.output[-4000:]
    lines = error_lines(second.output)
    assert lines and all(f"checkpoint.dir {ckpt_dir} is in use by another run" in x for x in lines)
    assert f"pid {run.pid}" not in lines[0], "the holder is rank 0, a worker, not the launcher"
    assert "pid " in lines[0]
