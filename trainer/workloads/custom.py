"""Bring-your-own workload: `workload.model` and `workload.data` name factories to import.

Protocol (the README's Workloads section has an example):
- model factory `f(cfg: WorkloadConfig)` returns an `nn.Module` whose `forward(batch)` returns
  the scalar loss, or a tuple `(module, loss_fn)` with `loss_fn(model, batch) -> loss`;
- data factory `g(cfg: WorkloadConfig)` returns a map-style dataset (train only, no eval) or a
  tuple `(train_set, eval_set)`, where eval_set may be None.
Both run under `torch.manual_seed(seed)`, so default-initialised weights match on every rank.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from ..config import WorkloadConfig
from .base import LossFn, Workload, WorkloadError, count_params, human_count, seeded

MODEL_EXPECTED = (
    "an nn.Module whose forward(batch) returns the scalar loss, or a tuple (nn.Module, loss_fn)"
)
DATA_EXPECTED = (
    "a map-style Dataset (with __len__ and __getitem__) or a tuple (train_set, eval_set or None)"
)


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def resolve_factory(key: str, spec: str) -> Callable[..., Any]:
    """'pkg.module:attr' -> the callable, with a one-line error for each way it can fail."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise WorkloadError(
            f"{key} {spec!r} must look like 'pkg.module:factory' "
            "(e.g. kubeddp.trainer.workloads.examples:make_model)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkloadError(
            f"{key} {spec!r}: cannot import module {module_name!r} ({exc}); install the "
            "package in the image or put its directory on PYTHONPATH"
        ) from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise WorkloadError(
                f"{key} {spec!r}: module {module_name!r} has no attribute {attr!r}; "
                "check the name after the ':'"
            )
        target = getattr(target, part)
    if not callable(target):
        raise WorkloadError(
            f"{key} {spec!r} is {_show(target)}, not callable; name a factory function"
        )
    return target


def _forward_returns_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(batch)


def _model_and_loss(spec: str, made: Any) -> tuple[nn.Module, LossFn]:
    if isinstance(made, nn.Module):
        return made, _forward_returns_loss
    if (
        isinstance(made, tuple)
        and len(made) == 2
        and isinstance(made[0], nn.Module)
        and callable(made[1])
    ):
        return made[0], made[1]
    raise WorkloadError(
        f"workload.model {spec!r} returned {_show(made)}; expected {MODEL_EXPECTED}"
    )


def _check_dataset(spec: str, role: str, dataset: Any) -> Dataset:
    if isinstance(dataset, IterableDataset) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise WorkloadError(
            f"workload.data {spec!r} returned {_show(dataset)} as {role}; expected a map-style "
            "Dataset with __len__ and __getitem__ (DistributedSampler shards by index)"
        )
    if len(dataset) == 0:
        raise WorkloadError(f"workload.data {spec!r} returned an empty {role}; it needs items")
    return dataset


def _datasets(spec: str, made: Any) -> tuple[Dataset, Dataset | None]:
    if isinstance(made, tuple):
        if len(made) != 2:
            raise WorkloadError(
                f"workload.data {spec!r} returned a tuple of {len(made)} items; "
                f"expected {DATA_EXPECTED}"
            )
        train, evaluation = made
        eval_set = None if evaluation is None else _check_dataset(spec, "eval_set", evaluation)
        return _check_dataset(spec, "train_set", train), eval_set
    if made is None or isinstance(made, (str, bytes)):
        raise WorkloadError(
            f"workload.data {spec!r} returned {_show(made)}; expected {DATA_EXPECTED}"
        )
    return _check_dataset(spec, "train_set", made), None


def build(cfg: WorkloadConfig, seed: int) -> Workload:
    model_factory = resolve_factory("workload.model", cfg.model)
    data_factory = resolve_factory("workload.data", cfg.data)
    with seeded(seed):
        model, loss_fn = _model_and_loss(cfg.model, model_factory(cfg))
    with seeded(seed):
        train_set, eval_set = _datasets(cfg.data, data_factory(cfg))
    eval_text = f"{len(eval_set)} eval" if eval_set is not None else "no eval"
    description = (
        f"custom: {cfg.model} ({human_count(count_params(model))} params) on {cfg.data} "
        f"({len(train_set)} train / {eval_text} items)"
    )
    return Workload(model, train_set, eval_set, loss_fn, 0, description)
