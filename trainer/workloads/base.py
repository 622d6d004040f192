"""The `Workload` the training loop consumes, and the helpers every workload shares."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from ..config import ConfigError

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


class WorkloadError(ConfigError):
    """A workload cannot be built from its config; the message names the value and the fix."""


@dataclass
class Workload:
    model: torch.nn.Module  # on CPU, freshly built; the loop moves it to the device
    train_set: Dataset  # map-style, len() defined, item i always the same
    eval_set: Dataset | None  # None: the loop skips evaluation
    loss_fn: LossFn  # (model, batch already on device) -> scalar loss
    tokens_per_sample: int  # charlm: seq_len; workloads without tokens: 0
    description: str  # one line for the log


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block under `torch.manual_seed(seed)`, leaving the caller's CPU RNG untouched.

    Every rank builds its model inside this, so all ranks start from identical weights
    before DDP's own broadcast (which then is a no-op check rather than a fix-up).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def count_params(model: torch.nn.Module) -> int:
    """Trainable parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def human_count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 1_000:
        return f"{n / 1e3:.2f}K"
    return str(n)
