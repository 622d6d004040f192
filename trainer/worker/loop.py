"""The DDP training loop: `fit` resumes, plans the steps left and runs `train_step` to the end.

Each component decides its own cadence when asked after a step or an epoch: the checkpoint
manager when to save, the evaluator when to evaluate, the progress output when to log.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from kubeddp.trainer.config import Config
from kubeddp.trainer.worker.checkpoint_manager import CheckpointManager
from kubeddp.trainer.worker.data import batch_samples, build_train_loader, to_device
from kubeddp.trainer.worker.distributed import (
    DistContext,
    mean_over_ranks,
    switch_to_training_timeout,
    wrap_ddp,
)
from kubeddp.trainer.worker.evaluator import Evaluator
from kubeddp.trainer.worker.metrics import TrainingMetrics
from kubeddp.trainer.worker.observer import SampleIdRecorder, StepEnd, step_times_file
from kubeddp.trainer.worker.precision import amp_dtype, autocast
from kubeddp.trainer.worker.preemption import (
    STOP_NONE,
    STOP_PREEMPT,
    STOP_SAVE_FAILED,
    Preempted,
    StopVote,
)
from kubeddp.trainer.worker.progress import Progress
from kubeddp.trainer.worker.sampler import ResumableDistributedSampler
from kubeddp.trainer.worker.schedule import build_optimizer, build_scheduler
from kubeddp.trainer.worker.steps import TrainState, steps_left
from kubeddp.trainer.workloads import build_workload

# What close() drops: everything that holds the DDP module, its parameters or the optimizer.
REFERENCES = "model raw_model optimizer scheduler scaler loader workload checkpoints evaluator"


class Trainer:
    def __init__(self, cfg: Config, ctx: DistContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        t = cfg.train
        torch.manual_seed(t.seed)
        random.seed(t.seed)
        self.workload = build_workload(cfg.workload, t.seed)
        self.raw_model = self.workload.model.to(ctx.device)
        compiled = torch.compile(self.raw_model) if t.compile else self.raw_model
        self.model = wrap_ddp(compiled, cfg.ddp, ctx)
        self.sampler = ResumableDistributedSampler(
            len(self.workload.train_set), ctx.world_size, ctx.rank, seed=t.seed
        )
        self.loader = build_train_loader(self.workload.train_set, self.sampler, t, ctx.device)
        self.state = TrainState()
        self.total_steps = self._plan_total_steps()
        self.optimizer = build_optimizer(self.raw_model.parameters(), t)
        self.scheduler = build_scheduler(self.optimizer, t, lambda: self.total_steps)
        self.amp_dtype = amp_dtype(t.amp, ctx.device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        self.progress = Progress(ctx.is_main, t.log_every)
        self.metrics = TrainingMetrics(
            cfg.metrics, ctx.rank, ctx.world_size, ctx.backend, device=ctx.device
        )
        tokens = self.workload.tokens_per_sample
        sample_ids = SampleIdRecorder() if t.record_sample_ids else None
        step_times = step_times_file(cfg, ctx.rank, ctx.world_size, tokens)
        self.observers = [o for o in (sample_ids, step_times) if o is not None]
        self.checkpoints = CheckpointManager(
            cfg,
            ctx,
            self.raw_model,
            self.optimizer,
            self.scheduler,
            self.scaler,
            metrics=self.metrics,
            log=self.progress.log,
            sample_ids=sample_ids,
        )
        self.evaluator = Evaluator(
            self.workload, t, ctx, self.model, self.raw_model, self.amp_dtype, self.progress.log
        )
        self.stop_vote = StopVote(ctx.device, ctx.distributed, cfg.checkpoint.preempt_grace_seconds)
        self.last_loss = float("nan")
        self._timeout_switched = False

    def _plan_total_steps(self) -> int:
        """The step this run ends at, planned from where it stands at this world size."""
        left = steps_left(self.state, self.sampler.dataset_len, self.ctx.world_size, self.cfg.train)
        return self.state.step + left

    def _finished(self) -> bool:
        return self.state.step >= self.total_steps or self.state.epoch >= self.cfg.train.epochs

    # ---- the run -----------------------------------------------------------------------
    def fit(self) -> int:
        """Train to the end (or until preempted); return the process exit code."""
        with self.stop_vote.catching_sigterm():
            self.state = self.checkpoints.resume() or self.state
            self.total_steps = self._plan_total_steps()
            self.progress.log(self._describe_run())
            self.progress.begin(self.state.step, self.total_steps)
            while not self._finished():
                code = self._train_epoch()
                if code:
                    self.stop_vote.drain()
                    return code
            self.stop_vote.drain()  # a stop voted during the last step comes too late to act
            self.evaluator.at_end(self.state.step)
            self.checkpoints.save(self.state, blocking=True)
            self.checkpoints.check_writer()
        t = self.cfg.train
        self.progress.done(
            self.state.step,
            mean_over_ranks(self.last_loss, self.ctx),
            self.state.first_loss,
            self.evaluator.val_loss,
            t.batch_size * t.grad_accum_steps * self.ctx.world_size,
            self.workload.tokens_per_sample,
        )
        for observer in self.observers:
            observer.on_fit_end()
        return 0 if self.checkpoints.stop_reason == STOP_NONE else 1

    def _describe_run(self) -> str:
        t, ctx = self.cfg.train, self.ctx
        return (
            f"[kubeddp] {self.workload.description} | world size {ctx.world_size} "
            f"({ctx.backend}, {ctx.device.type}) | batch {t.batch_size} x accum "
            f"{t.grad_accum_steps} x {ctx.world_size} ranks = "
            f"{t.batch_size * t.grad_accum_steps * ctx.world_size} samples/step | "
            f"{self.total_steps} steps"
        )

    def _train_epoch(self) -> int:
        """The rest of this epoch; a non-zero return is the exit code of a voted stop."""
        t, s = self.cfg.train, self.state
        self.sampler.set_epoch(s.epoch, s.consumed)
        for observer in self.observers:
            observer.on_epoch_start(s.epoch, self.sampler)
        batches = self._batches()
        micro_left = math.ceil(len(self.sampler) / t.batch_size)
        while micro_left:
            micro_steps = min(t.grad_accum_steps, micro_left)
            micro_left -= micro_steps
            self.train_step(batches, micro_steps)
            code = self._after_step()
            if code or self._finished():
                return code
        s.epoch += 1
        s.consumed = 0
        self.evaluator.after_epoch(s.step, s.epoch - 1)
        if not self._finished():
            self.checkpoints.maybe_save(s, epoch_end=True)
        return 0

    def _batches(self) -> Iterator[Any]:
        # A generator: the loader's iterator (and its worker processes) starts at the first
        # next(), inside the first step's data wait.
        yield from self.loader

    # ---- one step ----------------------------------------------------------------------
    def train_step(self, batches: Iterator[Any], micro_steps: int) -> None:
        """One optimizer step over `micro_steps` micro-batches; gradients sync on the last."""
        t, ctx, s = self.cfg.train, self.ctx, self.state
        start = time.perf_counter()
        data_wait, loss_sum, samples = 0.0, 0.0, 0
        for i in range(micro_steps):
            fetch_start = time.perf_counter()
            batch = next(batches)
            data_wait += time.perf_counter() - fetch_start
            batch = to_device(batch, ctx.device)
            samples += batch_samples(batch, t.batch_size)
            loss_sum += self._micro_step(batch, 1.0 / micro_steps, sync=i == micro_steps - 1)
        self._optimizer_step()
        s.consumed += samples * ctx.world_size
        s.step += 1
        loss = self.last_loss = loss_sum / micro_steps
        if s.first_loss is None:
            s.first_loss = loss
        seconds = time.perf_counter() - start
        for observer in self.observers:
            observer.on_step_end(StepEnd(s.step, s.epoch, samples))
        if not self._timeout_switched:
            switch_to_training_timeout(self.cfg.ddp)
            self._timeout_switched = True
        lr = self.scheduler.get_last_lr()[0]
        tokens = self.workload.tokens_per_sample
        self.metrics.on_step(
            step=s.step,
            epoch=s.epoch,
            loss=loss,
            lr=lr,
            samples=samples,
            tokens=samples * tokens,
            step_seconds=seconds,
            data_wait_seconds=data_wait,
        )
        if self.progress.is_log_step(s.step):
            loss = mean_over_ranks(loss, ctx)
        sps = samples * ctx.world_size / seconds if seconds > 0 else 0.0
        self.progress.step(s.step, s.epoch, loss, lr, sps, sps * tokens, seconds * 1000)

    def _micro_step(self, batch: Any, scale: float, sync: bool) -> float:
        no_sync = not sync and isinstance(self.model, DDP)
        with self.model.no_sync() if no_sync else contextlib.nullcontext():
            with autocast(self.ctx.device, self.amp_dtype):
                loss = self.workload.loss_fn(self.model, batch)
            self.scaler.scale(loss * scale).backward()
        return loss.detach().item()

    def _optimizer_step(self) -> None:
        clip = self.cfg.train.grad_clip
        if clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def _after_step(self) -> int:
        """Act on the ranks' stop vote, then let evaluation and checkpoints take their turn."""
        self.checkpoints.check_writer()
        stop = self.stop_vote.vote(self.checkpoints.stop_reason)
        if stop == STOP_PREEMPT:
            self.progress.log(
                f"[kubeddp] {self.stop_vote.signal_name}: saving a checkpoint at step "
                f"{self.state.step} before exiting"
            )
            self.stop_vote.drain()
            self.checkpoints.save(self.state, blocking=True)
            raise Preempted(self.stop_vote.exit_code)
        if stop == STOP_SAVE_FAILED:
            self.progress.log(
                "[kubeddp] stopping: a checkpoint could not be saved "
                "(checkpoint.on_save_error=stop)"
            )
            return 1
        self.evaluator.after_step(self.state.step)
        if not self._finished():
            self.checkpoints.maybe_save(self.state)
        return 0

    def close(self) -> None:
        """Drop every DDP/optimizer reference so the process group can be destroyed safely."""
        self.checkpoints.close()
        self.metrics.close()
        for name in REFERENCES.split():
            setattr(self, name, None)
