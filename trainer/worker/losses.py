"""Training losses kept on the device; read (a host sync) only when a log line needs one.

`loss.item()` after every micro-step makes the host wait for the GPU to finish the step, so
the GPU idles while the host prepares the next one. The loop instead hands each step's loss
tensor here and reads a value every train.log_every steps: the mean of the steps since the
previous read, averaged over the ranks in the same single read.
"""

from __future__ import annotations

import torch

from kubeddp.trainer.worker.distributed import DistContext, mean_over_ranks


class DeviceLosses:
    def __init__(self) -> None:
        self._interval: list[torch.Tensor] = []  # one 0-dim tensor per step since the last read
        self.last: torch.Tensor | None = None  # the latest step's loss (the done line's)
        self._first: torch.Tensor | None = None  # the run's first step, until first() reads it
        self._any_step = False

    def add(self, step_loss: torch.Tensor) -> None:
        """One optimizer step's loss (detached; on the device); costs no kernel launch."""
        self._interval.append(step_loss)
        self.last = step_loss
        if not self._any_step:
            self._first, self._any_step = step_loss, True

    def interval_mean(self, ctx: DistContext, extra: torch.Tensor | None = None) -> float:
        """Mean loss over the steps since the previous call and over all ranks (collective:
        every rank calls it at the same step). NaN when no step was added. `extra` is added
        before the read (the divergence guard's check rides on it: divergence.py)."""
        if not self._interval:
            return mean_over_ranks(float("nan"), ctx)
        steps = self._interval
        self._interval = []
        mean = steps[0] if len(steps) == 1 else torch.stack(steps).mean()
        return mean_over_ranks(mean if extra is None else mean + extra, ctx)

    def first(self) -> float | None:
        """This rank's loss of the run's first step, the first time it is asked (a host
        sync, once per run); None before the first step and after it was read."""
        if self._first is None:
            return None
        value = self._first.item()
        self._first = None
        return value
