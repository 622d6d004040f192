"""A tiny bring-your-own workload, usable as a template and in tests.

workload:
  name: custom
  model: kubeddp.trainer.workloads.examples:make_model
  data: kubeddp.trainer.workloads.examples:make_data

make_mlp reads its own hyperparameters from `workload.args` (`--set 'workload.args={hidden:
32, layers: 2}'`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..config import WorkloadConfig

DATA_SEED = 0  # fixed, so every rank (and every run) sees the same rows


class LinearRegressor(nn.Module):
    """forward(batch) returns the loss: the custom protocol's simplest form."""

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(input_dim, 1)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return nn.functional.mse_loss(self.linear(inputs), targets)


def make_model(cfg: WorkloadConfig) -> nn.Module:
    return LinearRegressor(cfg.input_dim)


def l1_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.l1_loss(model(inputs), targets)


def make_model_and_loss(cfg: WorkloadConfig) -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    """The tuple form: a plain module plus a separate loss function."""
    return nn.Linear(cfg.input_dim, 1), l1_loss


def make_data(cfg: WorkloadConfig) -> tuple[TensorDataset, TensorDataset]:
    gen = torch.Generator().manual_seed(DATA_SEED)
    weights = torch.randn(cfg.input_dim, 1, generator=gen)
    inputs = torch.randn(cfg.samples, cfg.input_dim, generator=gen)
    targets = inputs @ weights + 0.01 * torch.randn(cfg.samples, 1, generator=gen)
    n_eval = max(1, cfg.samples // 10)
    return (
        TensorDataset(inputs[n_eval:], targets[n_eval:]),
        TensorDataset(inputs[:n_eval], targets[:n_eval]),
    )


def make_train_only(cfg: WorkloadConfig) -> TensorDataset:
    """The single-dataset form: no eval set, so the loop skips evaluation."""
    return make_data(cfg)[0]


def make_mlp(cfg: WorkloadConfig) -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    """A model sized by `workload.args`: `hidden` units (default 16) in `layers` hidden layers
    (default 1); the factory's own settings, which kubeddp's config does not know."""
    hidden = int(cfg.args.get("hidden", 16))
    layers = int(cfg.args.get("layers", 1))
    blocks: list[nn.Module] = []
    width = cfg.input_dim
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.Tanh()]
        width = hidden
    return nn.Sequential(*blocks, nn.Linear(width, 1)), mse_loss


def mse_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs), targets)
