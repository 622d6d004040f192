"""The divergence guard: a non-finite loss or gradient norm is named with its step and rank.

No host sync per step: the loop hands each step's loss and gradient norm (device tensors)
here, and the log step's existing loss read carries the check (`fold` adds 0 x the norms to
the mean it reads: NaN when any of them is not finite). Only when that read is not finite does
each rank look at its own steps (more reads, on the failure path only) and the ranks gather
who saw what. `diagnostics.on_nonfinite` says what happens then:

- `stop`: every rank exits with NONFINITE (fatal: a retry would diverge the same way);
- `keep_last_good`: the same, after removing checkpoints saved at or after the first bad step
  (the check runs at the log cadence, so some may have been written), so a resume starts from
  the last good one;
- `skip`: each step checks its own loss and norm on the device and the optimizer leaves the
  parameters as they are when either is not finite (fused AdamW's `found_inf`, as GradScaler
  does: no sync; other optimizers read the flag, a host sync per step on a GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kubeddp.trainer.worker.distributed import DistContext, gather_objects


@dataclass(frozen=True)
class NonFinite:
    step: int
    rank: int
    what: str  # "loss" | "gradient norm"

    def describe(self) -> str:
        return f"non-finite {self.what} at step {self.step} on rank {self.rank}"


class NonFiniteGuard:
    def __init__(self, action: str, optimizer: torch.optim.Optimizer, scaler_on: bool) -> None:
        self.action = action
        self._steps: list[tuple[int, torch.Tensor, torch.Tensor | None]] = []
        self.skipped = 0
        groups = optimizer.param_groups
        # fused kernels skip on a device flag; GradScaler (fp16) skips non-finite grads itself
        self._device_skip = scaler_on or all(g.get("fused") for g in groups)
        self._scaler_on = scaler_on

    def record(self, step: int, loss: torch.Tensor, norm: torch.Tensor | None) -> None:
        """One step's loss and norm (device tensors); no kernel launch unless skipping."""
        self._steps.append((step, loss, norm))

    def fold(self) -> torch.Tensor | None:
        """0 x the interval's norms: added to the loss mean, it makes the read NaN when one
        of them is not finite (0 x inf = NaN)."""
        norms = [n for _, _, n in self._steps if n is not None]
        if not norms:
            return None
        return torch.stack(norms).sum() * 0.0

    def skip_flag(self, loss: torch.Tensor, norm: torch.Tensor | None) -> torch.Tensor | None:
        """With `skip`: the device flag that makes this step's update a no-op (None: fine)."""
        bad = ~torch.isfinite(loss)
        if norm is not None:
            bad = bad | ~torch.isfinite(norm)
        return bad.float()

    def check(self, read: float | None, ctx: DistContext) -> list[NonFinite]:
        """After a log step's read: every rank's first non-finite step of the interval
        (collective when `read` is not finite, which every rank sees alike)."""
        if read is None:
            return []
        steps, self._steps = self._steps, []
        if math.isfinite(read):
            return []
        mine: NonFinite | None = None
        for step, loss, norm in steps:  # the failure path: reads are fine here
            if not torch.isfinite(loss).item():
                mine = NonFinite(step, ctx.rank, "loss")
            elif norm is not None and not torch.isfinite(norm).item():
                mine = NonFinite(step, ctx.rank, "gradient norm")
            if mine is not None:
                break
        found = [f for f in gather_objects(mine) if f is not None]
        return sorted(found, key=lambda f: (f.step, f.rank))
