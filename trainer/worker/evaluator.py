"""Validation loss over the workload's eval set, and when to measure it (train.eval_every)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from kubeddp.trainer.config import TrainConfig
from kubeddp.trainer.worker.data import batch_samples, pins_memory, to_device
from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.precision import autocast
from kubeddp.trainer.worker.sampler import ResumableDistributedSampler
from kubeddp.trainer.workloads import Workload


class Evaluator:
    """Collective: every rank evaluates its share of the first train.eval_batches batches.

    `model` (the DDP wrapper) switches between train and eval mode; `raw_model` computes, so
    no gradient synchronisation is set up.
    """

    def __init__(
        self,
        workload: Workload,
        cfg: TrainConfig,
        ctx: DistContext,
        model: torch.nn.Module,
        raw_model: torch.nn.Module,
        amp_dtype: torch.dtype | None,
        log: Callable[[str], None],
    ) -> None:
        self.dataset = workload.eval_set
        self.loss_fn = workload.loss_fn
        self.cfg = cfg
        self.ctx = ctx
        self.model = model
        self.raw_model = raw_model
        self.amp_dtype = amp_dtype
        self.log = log
        self.val_loss: float | None = None
        self.evaluated_at = -1  # the step of the latest evaluation

    def should_eval(self, step: int) -> bool:
        return bool(self.cfg.eval_every) and step % self.cfg.eval_every == 0

    def after_step(self, step: int) -> None:
        if self.should_eval(step):
            self._evaluate_and_log(step, f"eval step {step}")

    def after_epoch(self, step: int, epoch: int) -> None:
        if not self.cfg.eval_every:  # 0: evaluate at the end of each epoch
            self._evaluate_and_log(step, f"eval epoch {epoch}")

    def at_end(self, step: int) -> None:
        """The final validation loss, unless this step was just evaluated."""
        if self.evaluated_at != step:
            self.evaluate(step)

    def _evaluate_and_log(self, step: int, what: str) -> None:
        val = self.evaluate(step)
        if val is not None:
            self.log(f"{what} | val loss {val:.4f}")

    def evaluate(self, step: int) -> float | None:
        """Mean loss over the eval batches of all ranks; None without an eval set."""
        ds, ctx = self.dataset, self.ctx
        if ds is None or len(ds) == 0:
            return None
        sampler = ResumableDistributedSampler(
            len(ds), ctx.world_size, ctx.rank, seed=0, shuffle=False
        )
        loader = DataLoader(
            ds,
            batch_size=self.cfg.batch_size,
            sampler=sampler,
            pin_memory=pins_memory(self.cfg, ctx.device),
        )
        loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        samples = 0
        self.model.eval()
        with torch.no_grad():
            for i, batch in enumerate(loader):
                if i >= self.cfg.eval_batches:
                    break
                batch = to_device(batch, ctx.device)
                with autocast(ctx.device, self.amp_dtype):
                    loss = self.loss_fn(self.raw_model, batch)
                n = batch_samples(batch, 1)
                loss_sum += loss.detach().double() * n  # on the device: one sync at the end
                samples += n
        self.model.train()
        total = torch.stack([loss_sum, torch.full_like(loss_sum, samples)])
        if ctx.distributed:
            dist.all_reduce(total)
        mean_loss, count = total.tolist()
        self.val_loss = mean_loss / max(count, 1)
        self.evaluated_at = step
        return self.val_loss
