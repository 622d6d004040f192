"""The DDP training loop: `fit` resumes, plans the steps left and runs `train_step` to the end.

Each component decides its own cadence when asked after a step or an epoch: the checkpoint
manager when to save, the evaluator when to evaluate, the progress output when to log.

The host never waits for the device inside a step: losses stay on the device until a log line
reads them (losses.py), the stop vote is read two steps after it is cast (preemption.py), and
clipping's norm is never read. tests/unit/test_no_host_sync.py keeps it that way.
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
from kubeddp.trainer.process_contract import PHASE_CODE
from kubeddp.trainer.worker import comm_hooks
from kubeddp.trainer.worker.checkpoint.manager import CheckpointManager, RunInfo
from kubeddp.trainer.worker.checkpoint.parts import OptimizerPart, RngPart, SampleRecordPart
from kubeddp.trainer.worker.compiled import CompiledForFullBatches, compile_plan
from kubeddp.trainer.worker.curves import Curves
from kubeddp.trainer.worker.data import (
    batch_samples,
    build_train_loader,
    leading_dim,
    to_device,
    unpinned_host_tensors,
)
from kubeddp.trainer.worker.diagnostics import Diagnostics
from kubeddp.trainer.worker.distributed import (
    DistContext,
    mean_over_ranks,
    switch_to_training_timeout,
    wrap_ddp,
)
from kubeddp.trainer.worker.evaluator import Evaluator
from kubeddp.trainer.worker.losses import DeviceLosses
from kubeddp.trainer.worker.metrics import TrainingMetrics
from kubeddp.trainer.worker.network import NetworkReport
from kubeddp.trainer.worker.observer import SampleIdRecorder, StepEnd, step_times_file
from kubeddp.trainer.worker.precision import amp_dtype, autocast, set_fp32_matmul_precision
from kubeddp.trainer.worker.preemption import (
    STOP_PREEMPT,
    STOP_SAVE_FAILED,
    Preempted,
    StopVote,
)
from kubeddp.trainer.worker.progress import Progress
from kubeddp.trainer.worker.sampler import ResumableDistributedSampler
from kubeddp.trainer.worker.schedule import build_optimizer, build_scheduler
from kubeddp.trainer.worker.snapshot.taker import for_worker as snapshots_for_worker
from kubeddp.trainer.worker.status_feed import for_rank as status_feed_for_rank
from kubeddp.trainer.worker.steps import TrainState, epoch_steps, micro_batches, steps_left
from kubeddp.trainer.worker.versions import runtime_versions
from kubeddp.trainer.workloads import build_workload

hb_data, hb_forward, hb_optimizer, hb_eval, hb_checkpoint, hb_between = (
    PHASE_CODE[name]
    for name in ("data", "forward/backward", "optimizer", "eval", "checkpoint", "step")
)

# What close() drops: everything that holds the DDP module, its parameters or the optimizer.
REFERENCES = (
    "model raw_model parameters compiled optimizer scheduler scaler loader workload checkpoints "
    "evaluator comm_hook"
)


class Trainer:
    def __init__(self, cfg: Config, ctx: DistContext, network: NetworkReport | None = None) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.network = network
        t = cfg.train
        torch.manual_seed(t.seed)
        random.seed(t.seed)
        set_fp32_matmul_precision(t.tf32, ctx.device)
        self.workload = build_workload(cfg.workload, t.seed)
        self.raw_model = self.workload.model.to(ctx.device)
        use_compile, compile_note = compile_plan(t.compile, ctx.device)
        if compile_note and ctx.is_main:
            print(f"[kubeddp] {compile_note}", flush=True)
        self.compiled = CompiledForFullBatches(self.raw_model) if use_compile else None
        inner = self.compiled if self.compiled is not None else self.raw_model
        self.model = wrap_ddp(inner, cfg.ddp, ctx)
        self.sampler = ResumableDistributedSampler(
            len(self.workload.train_set), ctx.world_size, ctx.rank, seed=t.seed
        )
        if t.drop_last and epoch_steps(self.sampler.dataset_len, ctx.world_size, t) == 0:
            raise ValueError(
                f"train.drop_last=true leaves no full batch: {self.sampler.dataset_len} samples "
                f"over {ctx.world_size} ranks is less than train.batch_size={t.batch_size} "
                "per rank; lower the batch size or set train.drop_last=false"
            )
        self.loader = build_train_loader(self.workload.train_set, self.sampler, t, ctx.device)
        self.state = TrainState()
        self.total_steps = self._plan_total_steps()
        # Listed once: walking the module tree for clipping costs ~0.1 ms of host time a step.
        self.parameters = list(self.raw_model.parameters())
        self.comm_hook = comm_hooks.build(cfg.ddp, self.parameters, t.seed)
        self.optimizer = build_optimizer(self.parameters, t)
        self.scheduler = build_scheduler(self.optimizer, t, lambda: self.total_steps)
        self.amp_dtype = amp_dtype(t.amp, ctx.device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        tokens = self.workload.tokens_per_sample
        self.progress = Progress(ctx.is_main, t.log_every, tokens)
        self.status = status_feed_for_rank(ctx.rank)  # a TrainJob's status, on rank 0
        self.versions = runtime_versions(ctx.device.type)
        self.metrics = TrainingMetrics(
            cfg.metrics,
            ctx.rank,
            ctx.world_size,
            ctx.backend,
            device=ctx.device,
            versions=self.versions,
            transport=network.info_labels() if network else None,
        )
        self.curves = Curves(
            cfg.metrics.tensorboard, cfg.checkpoint.dir, ctx.is_main, self.progress.log
        )
        self.losses = DeviceLosses()
        sample_ids = SampleIdRecorder() if t.record_sample_ids else None
        step_times = step_times_file(t, ctx.rank, ctx.world_size, tokens, ctx.device)
        self.observers = [o for o in (sample_ids, step_times) if o is not None]
        parts = {  # what a checkpoint holds: a new piece of state is one line here
            "model": self.raw_model,
            "optimizer": OptimizerPart(self.optimizer),
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "trainer": self.state,  # step, epoch, position in the epoch
            "sampler": self.sampler,  # the size of the epoch order the position counts in
            "rng": RngPart(),
            "sample_record": SampleRecordPart(sample_ids) if sample_ids else None,
            "comm_hook": self.comm_hook.part if self.comm_hook else None,  # PowerSGD's state
        }
        run = RunInfo(cfg.model_hash(), cfg.config_hash(), cfg.to_yaml(), t.seed)
        self.checkpoints = CheckpointManager(
            cfg.checkpoint,
            ctx,
            run,
            {name: part for name, part in parts.items() if part is not None},
            metrics=self.metrics,
            log=self.progress.log,
            before_save=self._before_save,
            snapshots=snapshots_for_worker(
                cfg.checkpoint,
                ctx.device,
                {"model_hash": run.model_hash, "seed": run.seed},
                self.progress.log,
                self._on_snapshot,
            ),
            after_save=self.curves.on_checkpoint,
        )
        self.checkpoints.guard_updates(self.optimizer)
        self.evaluator = Evaluator(
            self.workload, t, ctx, self.model, self.raw_model, self.amp_dtype, self.progress.log
        )
        self.stop_vote = StopVote(ctx.device, ctx.distributed, cfg.checkpoint.preempt_grace_seconds)
        self._timeout_switched = False
        self.diag = Diagnostics(
            cfg.diagnostics, ctx, self.optimizer, self.scaler.is_enabled(), self.progress
        )
        self.diag.watch(self.model, self.comm_hook)
        self._copies_checked = ctx.device.type != "cuda"

    def _on_snapshot(self, published: Any) -> None:
        """An in-memory snapshot is whole (called from the snapshot thread)."""
        self.metrics.on_snapshot(published)
        self.checkpoints.on_snapshot(published)

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
            self.checkpoints.start_snapshots(self.state.step)
            self.total_steps = self._plan_total_steps()
            self.metrics.on_plan(self.total_steps)
            self.progress.log(self._describe_run())
            self.progress.begin(self.state.step, self.total_steps)
            while not self._finished():
                code = self._train_epoch()
                if code:
                    self.stop_vote.drain()
                    return code
            self.stop_vote.drain()  # a stop voted in the last two steps comes too late to act
            self.evaluator.at_end(self.state.step)
            self._eval_point()
            self.checkpoints.save(self.state, blocking=True, final=True)
            self._feed_status(None, final=True)
        t = self.cfg.train
        last = self.losses.last
        self._settle_first_loss()
        self.progress.done(
            self.state.step,
            mean_over_ranks(last if last is not None else float("nan"), self.ctx),
            self.state.first_loss,
            self.evaluator.val_loss,
            t.batch_size * t.grad_accum_steps * self.ctx.world_size,
            self.workload.tokens_per_sample,
        )
        for observer in self.observers:
            observer.on_fit_end()
        return self.checkpoints.exit_code()

    def _describe_run(self) -> str:
        t, ctx = self.cfg.train, self.ctx
        return (
            f"[kubeddp] {self.workload.description} | world size {ctx.world_size} "
            f"({ctx.backend}, {ctx.device.type}) | {self.versions.describe()} | "
            f"{self._describe_network()}"
            f"batch {t.batch_size} x accum "
            f"{t.grad_accum_steps} x {ctx.world_size} ranks = "
            f"{t.batch_size * t.grad_accum_steps * ctx.world_size} samples/step | "
            f"{self.total_steps} steps"
        )

    def _describe_network(self) -> str:
        described = self.network.describe() if self.network else ""
        return f"NCCL transport: {described} | " if described else ""

    def _train_epoch(self) -> int:
        """The rest of this epoch; a non-zero return is the exit code of a voted stop."""
        t, s = self.cfg.train, self.state
        self.sampler.set_epoch(s.epoch, s.consumed)
        for observer in self.observers:
            observer.on_epoch_start(s.epoch, self.sampler)
        batches = self._batches()
        micro_left = micro_batches(len(self.sampler), t)
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
        self._eval_point()
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
        data_wait, samples = 0.0, 0
        loss_sum: torch.Tensor | None = None
        hb = self.diag.heartbeat
        for i in range(micro_steps):
            hb.phase(hb_data)
            fetch_start = time.perf_counter()
            batch = next(batches)
            data_wait += time.perf_counter() - fetch_start
            if not self._copies_checked:
                self._check_copies(batch)
            batch = to_device(batch, ctx.device)
            samples += batch_samples(batch, t.batch_size)
            hb.phase(hb_forward)
            loss = self._micro_step(batch, micro_steps, sync=i == micro_steps - 1)
            loss_sum = loss if loss_sum is None else loss_sum + loss
        hb.phase(hb_optimizer)
        assert loss_sum is not None
        step_loss = loss_sum / micro_steps if micro_steps > 1 else loss_sum
        self._optimizer_step(step_loss)
        self.losses.add(step_loss)
        s.consumed += samples * ctx.world_size
        s.step += 1
        seconds = time.perf_counter() - start
        hb.step_done(s.step, hb_between, seconds)
        if self.observers:
            end = StepEnd(s.step, s.epoch, samples)
            for observer in self.observers:
                observer.on_step_end(end)
        if not self._timeout_switched:
            switch_to_training_timeout(self.cfg.ddp, self.progress.log)
            self._timeout_switched = True
        lr = self.scheduler.get_last_lr()[0]
        # Reading the loss waits for the device: only on log steps (collective, every rank).
        loss_value = (
            self.losses.interval_mean(ctx, self.diag.guard.fold())
            if self.progress.is_log_step(s.step)
            else None
        )
        self.diag.after_read(s.step, loss_value, self.checkpoints)
        if loss_value is not None and s.first_loss is None:
            self._settle_first_loss()
        self.metrics.on_step(
            step=s.step,
            epoch=s.epoch,
            loss=loss_value,
            lr=lr,
            samples=samples,
            tokens=samples * self.workload.tokens_per_sample,
            step_seconds=seconds,
            data_wait_seconds=data_wait,
        )
        self.curves.on_step(s.step, loss=loss_value, lr=lr, samples=samples * ctx.world_size,
                            step_seconds=seconds)  # fmt: skip
        first = self.progress.first_step_seconds is None
        self.progress.step(s.step, s.epoch, lr, samples * ctx.world_size, loss_value)
        self._feed_status(loss_value)
        if first:
            self._log_first_step()

    def _feed_status(self, loss: float | None, final: bool = False) -> None:
        """Rank 0's progress for the TrainJob's status (status_feed.py); the epochs' total
        only when they, not train.max_steps, end the run."""
        if self.status is None:
            return
        s, t = self.state, self.cfg.train
        by_max_steps = bool(t.max_steps) and self.total_steps == t.max_steps
        self.status.update(
            s.step,
            total_steps=self.total_steps,
            epoch=s.epoch,
            total_epochs=None if by_max_steps else t.epochs,
            loss=loss,
            eval_loss=self.evaluator.val_loss,
            eta_seconds=self.progress.eta_seconds(s.step),
        )
        if final:
            self.status.flush()

    def _micro_step(self, batch: Any, micro_steps: int, sync: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; its loss, detached, still on the device."""
        no_sync = not sync and isinstance(self.model, DDP)
        with self.model.no_sync() if no_sync else contextlib.nullcontext():
            if self.compiled is not None:
                self.compiled.full_batch = leading_dim(batch) == self.cfg.train.batch_size
            with autocast(self.ctx.device, self.amp_dtype):
                loss = self.workload.loss_fn(self.model, batch)
            scaled = loss * (1.0 / micro_steps) if micro_steps > 1 else loss
            self.scaler.scale(scaled).backward()
        return loss.detach()

    def _optimizer_step(self, loss: torch.Tensor) -> None:
        clip = self.cfg.train.grad_clip
        norm = None
        if clip > 0 or self.diag.needs_norm:
            self.scaler.unscale_(self.optimizer)
            # Returns the norm as a device tensor; reading it would sync, so it is not read.
            norm = torch.nn.utils.clip_grad_norm_(self.parameters, clip if clip > 0 else math.inf)
        if self.diag.before_update(self.state.step + 1, loss, norm, self.optimizer):
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def _eval_point(self) -> None:
        """The validation loss on the curves, when this step was just evaluated."""
        if self.evaluator.evaluated_at == self.state.step:
            self.curves.on_eval(self.state.step, self.evaluator.val_loss)

    def _before_save(self) -> None:
        """Before a checkpoint or an in-memory snapshot holds this step: the first loss settled,
        and the metrics of every step it holds written. A worker SIGKILLed after a snapshot
        would otherwise lose the counts it had not flushed yet, and the resume from that
        snapshot never runs those steps again."""
        self._settle_first_loss()
        self.metrics.flush()

    def _settle_first_loss(self) -> None:
        """The run's first loss into the train state (read once: before the first log line or
        the first checkpoint, whichever comes first)."""
        if self.state.first_loss is None:
            self.state.first_loss = self.losses.first()

    def _check_copies(self, batch: Any) -> None:
        """Once, on CUDA: warn when batches arrive outside pinned memory (their copies to the
        GPU then block the host, whatever non_blocking says)."""
        self._copies_checked = True
        unpinned = unpinned_host_tensors(batch)
        if unpinned:
            self.progress.log(
                f"[kubeddp] note: {unpinned} tensor(s) of each batch are not in pinned memory, "
                "so copying them to the GPU blocks the host; keep train.pin_memory=true and "
                "return CPU tensors from the dataset"
            )

    def _log_first_step(self) -> None:
        seconds = self.progress.first_step_seconds or 0.0
        compiled = ", torch.compile included" if self.compiled is not None else ""
        self.progress.log(
            f"[kubeddp] first step: {seconds:.1f}s (warm-up{compiled}); later rates leave it out"
        )

    def _after_step(self) -> int:
        """Act on the ranks' stop vote, then let evaluation and checkpoints take their turn."""
        self.checkpoints.check_writer()
        stop, save_due = self.stop_vote.vote(
            self.checkpoints.stop_reason, self.checkpoints.save_due()
        )
        if stop == STOP_PREEMPT:
            self.progress.log(
                f"[kubeddp] {self.stop_vote.signal_name}: saving a checkpoint at step "
                f"{self.state.step} before exiting"
            )
            self.stop_vote.drain()
            self.checkpoints.save(self.state, blocking=True)
            self.checkpoints.maybe_snapshot(self.state, now=True)  # the peers that stay hold it
            raise Preempted(self.stop_vote.exit_code)
        if stop == STOP_SAVE_FAILED:
            self.progress.log(
                "[kubeddp] stopping: a checkpoint could not be saved "
                "(checkpoint.on_save_error=stop)"
            )
            return 1
        self.diag.heartbeat.phase(hb_eval)
        self.evaluator.after_step(self.state.step)
        self._eval_point()
        if not self._finished():
            self.diag.heartbeat.phase(hb_checkpoint)
            self.checkpoints.maybe_save(self.state, due=save_due)
            self.checkpoints.maybe_snapshot(self.state)
        return 0

    def close(self) -> None:
        """Drop every DDP/optimizer reference so the process group can be destroyed safely."""
        self.diag.close()
        self.checkpoints.close()
        self.metrics.close()
        self.curves.close()
        for name in REFERENCES.split():
            setattr(self, name, None)
