"""Workloads behind one builder: each module here (config.workload_names) is one workload,
named after its file, with a `build(cfg, seed) -> Workload`."""

from __future__ import annotations

import importlib

from ..config import WorkloadConfig, workload_names
from .base import Workload, WorkloadError

__all__ = ["Workload", "WorkloadError", "build_workload"]


def build_workload(cfg: WorkloadConfig, seed: int) -> Workload:
    """Build model, datasets and loss for `cfg.name`; the same seed gives the same weights."""
    names = workload_names()
    if cfg.name not in names:
        raise WorkloadError(f"workload.name {cfg.name!r} is unknown; use one of {', '.join(names)}")
    return importlib.import_module(f"{__package__}.{cfg.name}").build(cfg, seed)
