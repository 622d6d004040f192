"""Smoke-test workload: a two-layer MLP fitting a fixed random linear map plus small noise."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..config import WorkloadConfig
from .base import Workload, WorkloadError, count_params, human_count, seeded

NOISE_STD = 0.05
EVAL_FRACTION = 0.1


def make_mlp(input_dim: int, hidden_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 1))


def make_data(samples: int, input_dim: int, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Rows x ~ N(0, I), y = x @ w + noise; w scaled so that y has unit variance."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(input_dim, 1, generator=gen) / input_dim**0.5
    inputs = torch.randn(samples, input_dim, generator=gen)
    targets = inputs @ weights + NOISE_STD * torch.randn(samples, 1, generator=gen)
    n_eval = max(1, int(samples * EVAL_FRACTION))
    n_train = samples - n_eval
    return (
        TensorDataset(inputs[:n_train], targets[:n_train]),
        TensorDataset(inputs[n_train:], targets[n_train:]),
    )


def mse_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs), targets)


def build(cfg: WorkloadConfig, seed: int) -> Workload:
    if cfg.samples < 2:
        raise WorkloadError(
            f"workload.samples is {cfg.samples}; regression needs at least 2 (train + eval rows)"
        )
    for key in ("input_dim", "hidden_dim"):
        if getattr(cfg, key) < 1:
            raise WorkloadError(f"workload.{key} is {getattr(cfg, key)}; it must be >= 1")
    with seeded(seed):
        model = make_mlp(cfg.input_dim, cfg.hidden_dim)
    train_set, eval_set = make_data(cfg.samples, cfg.input_dim, seed)
    description = (
        f"regression: {human_count(count_params(model))} params, MLP {cfg.input_dim}"
        f"->{cfg.hidden_dim}->1, {len(train_set)} train / {len(eval_set)} eval synthetic rows"
    )
    return Workload(model, train_set, eval_set, mse_loss, 0, description)
