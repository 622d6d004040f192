"""Optimizer and learning-rate schedule (linear warm-up, then cosine decay to a floor)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kubeddp.trainer.config import TrainConfig


def build_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_factor(step: int, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    opt: torch.optim.Optimizer, cfg: TrainConfig, total_steps: Callable[[], int]
) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule spans `total_steps()`, asked at every step: a resume at another world size
    re-plans the run's length, and the decay then ends where the run now ends."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, total_steps(), cfg.warmup_steps, cfg.min_lr_ratio)
    )
