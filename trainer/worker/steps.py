"""Where training stands, and how many optimizer steps are left from there.

The position inside an epoch is `consumed`, global samples (see sampler.py), so it holds for
any world size: a run resumed at another world size plans its remaining steps from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kubeddp.trainer.config import TrainConfig


@dataclass
class TrainState:
    """The trainer's own part of a checkpoint."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    consumed: int = 0  # global samples of `epoch` already trained
    first_loss: float | None = None  # the loss of the run's first step (the "start" in the log)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "first_loss": self.first_loss,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch = state["step"], state["epoch"]
        self.consumed, self.first_loss = state["consumed"], state.get("first_loss")


def micro_batches(per_rank: int, cfg: TrainConfig) -> int:
    """Micro-batches one rank runs over `per_rank` samples: with train.drop_last the short
    last batch is skipped (every batch then has the same shape)."""
    if cfg.drop_last:
        return per_rank // cfg.batch_size
    return math.ceil(per_rank / cfg.batch_size)


def epoch_steps(samples: int, world_size: int, cfg: TrainConfig) -> int:
    """Optimizer steps that train `samples` global samples split over `world_size` ranks."""
    per_rank = math.ceil(max(0, samples) / world_size)
    return math.ceil(micro_batches(per_rank, cfg) / cfg.grad_accum_steps)


def steps_left(state: TrainState, dataset_len: int, world_size: int, cfg: TrainConfig) -> int:
    """Optimizer steps from `state` to the end of training at this world size: the rest of
    this epoch, the epochs after it, capped by train.max_steps."""
    if state.epoch >= cfg.epochs:
        return 0
    left = epoch_steps(dataset_len - state.consumed, world_size, cfg)
    left += epoch_steps(dataset_len, world_size, cfg) * (cfg.epochs - state.epoch - 1)
    if cfg.max_steps:
        left = min(left, max(0, cfg.max_steps - state.step))
    return left
