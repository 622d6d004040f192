"""ddp.comm_hook=powersgd over gloo with two real processes: a run resumed from a checkpoint
ends bitwise equal to the uninterrupted one (CPU, two ranks: the sum of two gradients does not
depend on the order), with gradient accumulation (no_sync) and the straggler measurement on.

Resumed right where compression starts (the first compressed step is the resumed process's
first, with DDP's unrebuilt buckets) and in the middle of it (error feedback and warm-start
factors from the checkpoint).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers import checkpoints as ck
from tests.helpers import procs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
POWERSGD = (
    "ddp.comm_hook=powersgd",
    "ddp.powersgd_start_step=5",
    "ddp.powersgd_rank=2",
    "train.grad_accum_steps=2",
    "checkpoint.keep=20",
)
FINAL = ck.STEPS_2_RANKS // 2  # two micro-batches per step


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("powersgd")
    done = procs.run(ck.scenario_argv(work / "baseline", *POWERSGD), work / "b.log", timeout=180)
    assert done.code == 0, done.output[-4000:]
    return work / "baseline"


@pytest.mark.parametrize("resume_at", [5, 20])
def test_a_resumed_run_ends_bitwise_equal(baseline: Path, tmp_path: Path, resume_at: int) -> None:
    assert ck.steps(baseline)[-1] == FINAL
    ckpt_dir = tmp_path / "resumed"
    shutil.copytree(baseline, ckpt_dir)
    for step in ck.steps(ckpt_dir):
        if step > resume_at:
            shutil.rmtree(ckpt_dir / f"ckpt-{step:08d}")
    done = procs.run(ck.scenario_argv(ckpt_dir, *POWERSGD), tmp_path / "r.log", timeout=180)
    assert done.code == 0, done.output[-4000:]
    assert f"resumed from {ckpt_dir / f'ckpt-{resume_at:08d}'}" in done.output
    want, got = ck.newest_state(baseline), ck.newest_state(ckpt_dir)
    ck.assert_same_parameters(got, want)
    ck.assert_each_sample_once(got, ck.TRAIN_ROWS, ck.EPOCHS)
    # the hook's state is in the checkpoint: one entry per rank, compression in play
    hook = got["comm_hook"]
    assert len(hook) == 2 and all(rank["iter"] == FINAL for rank in hook)
    errors = [d["error"] for rank in hook for d in rank["params"].values()]
    assert errors and all(isinstance(e, torch.Tensor) for e in errors)
    assert any(e.abs().sum() > 0 for e in errors)
    for rank_got, rank_want in zip(hook, want["comm_hook"], strict=True):
        for i, parts in rank_want["params"].items():
            for kind, tensor in parts.items():
                assert torch.equal(rank_got["params"][i][kind], tensor), (i, kind)


@pytest.mark.parametrize("nproc", [1, 3])
def test_a_run_resumed_by_another_number_of_workers_trains_on(
    baseline: Path, tmp_path: Path, nproc: int
) -> None:
    """Resumed by fewer or more workers than wrote the checkpoint: every rank takes the saved
    step count (a new rank kept 0 and ran plain all-reduce while the others ran PowerSGD:
    gloo aborted on the size mismatch, exit 134), the warm-start factors (the same on every
    rank) are restored, each rank's error feedback starts afresh, and one line says so."""
    ckpt_dir = tmp_path / "resumed"
    shutil.copytree(baseline, ckpt_dir)
    for step in ck.steps(ckpt_dir):
        if step > 20:
            shutil.rmtree(ckpt_dir / f"ckpt-{step:08d}")
    argv = ck.scenario_argv(ckpt_dir, *POWERSGD, nproc=nproc)
    done = procs.run(argv, tmp_path / "r.log", timeout=180)
    assert done.code == 0, done.output[-4000:]
    assert "the checkpoint was written by 2 workers, this run has" in done.output
    hook = ck.newest_state(ckpt_dir)["comm_hook"]
    assert len(hook) == nproc and len({rank["iter"] for rank in hook}) == 1
