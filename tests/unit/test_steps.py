"""The remaining-steps plan: a pure function of where training stands, the world size and the
train settings (what `fit` re-plans from after a resume)."""

from __future__ import annotations

import pytest

from kubeddp.trainer.config import TrainConfig
from kubeddp.trainer.worker.steps import TrainState, epoch_steps, micro_batches, steps_left

pytestmark = pytest.mark.timeout(30)

ROWS = 1152  # the resume scenario of tests/helpers/checkpoints.py: 2 ranks x 16 x 36 steps


def train(**settings: int | bool) -> TrainConfig:
    return TrainConfig(**{"batch_size": 16, "epochs": 2, **settings})


def test_fresh_start_runs_every_epoch() -> None:
    assert steps_left(TrainState(), ROWS, 2, train()) == 2 * 36
    assert steps_left(TrainState(), ROWS, 1, train()) == 2 * 72
    # 400 rows, batch 30: 14 micro-batches (the last one short), 4 of them per step -> 4 steps.
    assert steps_left(TrainState(), 400, 1, train(batch_size=30, epochs=1)) == 14
    assert steps_left(TrainState(), 400, 1, train(batch_size=30, grad_accum_steps=4)) == 2 * 4


def test_mid_epoch_resume_counts_the_rest_of_the_epoch() -> None:
    state = TrainState(step=10, epoch=0, consumed=10 * 16 * 2)
    assert steps_left(state, ROWS, 2, train()) == (36 - 10) + 36
    second_epoch = TrainState(step=40, epoch=1, consumed=4 * 16 * 2)
    assert steps_left(second_epoch, ROWS, 2, train()) == 36 - 4


def test_same_world_resume_ends_where_the_fresh_plan_ends() -> None:
    cfg = train(grad_accum_steps=3)
    total = steps_left(TrainState(), ROWS, 2, cfg)
    per_step = 16 * 3 * 2
    for step in range(total):
        epoch, k = divmod(step, epoch_steps(ROWS, 2, cfg))
        state = TrainState(step=step, epoch=epoch, consumed=k * per_step)
        assert state.step + steps_left(state, ROWS, 2, cfg) == total, state


def test_world_size_changed_plans_from_the_samples_left() -> None:
    # 10 steps at 2 ranks consumed 320 rows; 832 are left in epoch 0, then a whole epoch.
    state = TrainState(step=10, epoch=0, consumed=320)
    assert steps_left(state, ROWS, 1, train()) == 832 // 16 + 72
    # 3 ranks: ceil(832 / 3) = 278 rows each -> 18 steps; a whole epoch is 384 rows -> 24.
    assert steps_left(state, ROWS, 3, train()) == 18 + 24


def test_max_steps_caps_the_plan() -> None:
    cfg = train(max_steps=12)
    assert steps_left(TrainState(), ROWS, 2, cfg) == 12
    assert steps_left(TrainState(step=8, consumed=8 * 32), ROWS, 2, cfg) == 4
    assert steps_left(TrainState(step=12, consumed=12 * 32), ROWS, 2, cfg) == 0
    # A cap beyond the epochs' end changes nothing.
    assert steps_left(TrainState(), ROWS, 2, train(max_steps=1000)) == 72


def test_nothing_is_left_after_the_last_epoch() -> None:
    assert steps_left(TrainState(step=72, epoch=2), ROWS, 2, train()) == 0
    # Saved on the last step of epoch 0, before the epoch counter moved on: only epoch 1 left.
    assert steps_left(TrainState(step=36, epoch=0, consumed=ROWS), ROWS, 2, train()) == 36


def test_drop_last_skips_each_epochs_short_batch() -> None:
    # 400 rows, batch 30, one rank: 13 full batches and one of 10, which drop_last skips.
    keep = train(batch_size=30, epochs=1)
    drop = train(batch_size=30, epochs=1, drop_last=True)
    assert micro_batches(400, keep) == 14 and micro_batches(400, drop) == 13
    assert steps_left(TrainState(), 400, 1, drop) == 13
    assert steps_left(TrainState(), 400, 1, train(batch_size=30, epochs=2, drop_last=True)) == 26
    # Two ranks: 200 rows each, 6 full batches; 4 per step -> 2 steps (the second with 2).
    assert (
        steps_left(
            TrainState(), 400, 2, train(batch_size=30, grad_accum_steps=4, epochs=1, drop_last=True)
        )
        == 2
    )
    assert epoch_steps(20, 1, drop) == 0, "fewer rows than a batch: nothing to train"


def test_drop_last_resume_ends_where_the_fresh_plan_ends() -> None:
    cfg = train(batch_size=30, drop_last=True)
    total = steps_left(TrainState(), 1000, 2, cfg)
    for step in range(total):
        epoch, k = divmod(step, epoch_steps(1000, 2, cfg))
        state = TrainState(step=step, epoch=epoch, consumed=k * 30 * 2)
        assert state.step + steps_left(state, 1000, 2, cfg) == total, state
