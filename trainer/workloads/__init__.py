"""Built-in workloads (regression, charlm) and bring-your-own (custom), behind one builder."""

from __future__ import annotations

from ..config import WorkloadConfig
from . import charlm, custom, regression
from .base import Workload, WorkloadError

BUILDERS = {"regression": regression.build, "charlm": charlm.build, "custom": custom.build}

__all__ = ["Workload", "WorkloadError", "build_workload"]


def build_workload(cfg: WorkloadConfig, seed: int) -> Workload:
    """Build model, datasets and loss for `cfg.name`; the same seed gives the same weights."""
    builder = BUILDERS.get(cfg.name)
    if builder is None:
        raise WorkloadError(
            f"workload.name {cfg.name!r} is unknown; use one of {', '.join(BUILDERS)}"
        )
    return builder(cfg, seed)
