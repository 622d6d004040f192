"""What the training loop asks of diagnostics: its heartbeat, the divergence guard, and what
to do when a log step's read is not finite (divergence.py)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from kubeddp.trainer import exit_codes
from kubeddp.trainer.config import DiagnosticsConfig
from kubeddp.trainer.worker import collectives
from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.divergence import NonFinite, NonFiniteGuard
from kubeddp.trainer.worker.grad_ready import LastGradient
from kubeddp.trainer.worker.heartbeat import Heartbeat, this_rank
from kubeddp.trainer.worker.straggler import StragglerWatch


class Diverged(Exception):
    """A non-finite loss or norm under on_nonfinite=stop/keep_last_good: the exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Diagnostics:
    def __init__(
        self,
        settings: DiagnosticsConfig,
        ctx: DistContext,
        optimizer: torch.optim.Optimizer,
        scaler_on: bool,
        progress: Any,
    ) -> None:
        d = settings
        self.ctx, self.progress = ctx, progress
        self.heartbeat: Heartbeat = this_rank() if d.enabled else Heartbeat(None, ctx.rank)
        collectives.install(self.heartbeat)
        self.guard = NonFiniteGuard(d.on_nonfinite, optimizer, scaler_on)
        # skip decides per step, on every rank alike: the all-reduced gradient norm says it
        self.needs_norm = d.on_nonfinite == "skip"
        self._skipped: list[int] = []
        self.last_gradient: LastGradient | None = None  # set by watch()
        self.stragglers = StragglerWatch(
            ctx, self.heartbeat, d.straggler_factor, d.straggler_window_seconds, progress.log
        )

    def watch(self, model: torch.nn.Module, hook: Any = None) -> None:
        """Register `hook` (comm_hooks.CommHook, None: DDP's own all-reduce) on a DDP model,
        with the straggler measurement's mark before it."""
        self.last_gradient = collectives.watch_ddp(model, self.heartbeat, hook)

    def before_update(
        self, step: int, loss: torch.Tensor, norm: torch.Tensor | None, optimizer: Any
    ) -> bool:
        """Record the step; False when the optimizer step must not run (skip, host path)."""
        self.guard.record(step, loss, norm)
        if self.last_gradient is not None:
            self.last_gradient.step_done()
        if not self.needs_norm:
            return True
        flag = self.guard.skip_flag(loss, norm)
        if self.guard._scaler_on:
            return True  # GradScaler skips non-finite gradients itself
        if self.guard._device_skip:
            optimizer.found_inf = flag  # fused kernels skip on it, on the device
            return True
        if flag.item():  # a host read: other optimizers have no device-side skip
            self._skipped.append(step)
            return False
        return True

    def after_read(self, step: int, read: float | None, checkpoints: Any) -> None:
        """After every step; on log steps (`read` is the loss read): name non-finite steps
        and act on them, and judge stragglers."""
        if read is None:
            return
        self.stragglers.at_log_step(step)
        found = self.guard.check(read, self.ctx)
        if not found:
            return
        first = found[0]
        for item in found:
            if item.rank == self.ctx.rank:
                self.heartbeat.nonfinite(item.step, item.what)
        action = self.guard.action
        names = "; ".join(f.describe() for f in found)
        if action == "skip":
            self.progress.log(f"[kubeddp] {names}: the step was skipped (on_nonfinite=skip)")
            return
        if action == "keep_last_good":
            removed = remove_checkpoints_from(checkpoints, first.step) if self.ctx.is_main else []
            kept = f"; set aside the checkpoints of steps {removed}" if removed else ""
            self.progress.log(f"[kubeddp] {names}: stopping, last good checkpoint kept{kept}")
        else:
            self.progress.log(f"[kubeddp] {names}: stopping (diagnostics.on_nonfinite=stop)")
        raise Diverged(exit_codes.NONFINITE)

    def close(self) -> None:
        if self.last_gradient is not None:
            self.last_gradient.close()
        self.heartbeat.close()


def remove_checkpoints_from(checkpoints: Any, step: int) -> list[int]:
    """Set aside (renamed, not deleted) the checkpoints saved at or after `step`: they may
    hold non-finite weights, and a resume must not pick them."""
    storage = checkpoints.storage
    if storage is None:
        return []
    if checkpoints.writer is not None:
        with contextlib.suppress(Exception):
            checkpoints.writer.wait()  # a save still in flight lands first
    moved = []
    for ref in storage.list():
        if ref.step >= step and storage.set_aside(ref, ".bad") is not None:
            moved.append(ref.step)
    return sorted(moved)


__all__ = ["Diagnostics", "Diverged", "NonFinite"]
