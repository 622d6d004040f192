"""The DDP training loop: one readable Trainer whose whole state is checkpointable."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from kubeddp.trainer import checkpoint as ckpt
from kubeddp.trainer import constants
from kubeddp.trainer.config import Config
from kubeddp.trainer.distributed import DistContext, switch_to_training_timeout
from kubeddp.trainer.metrics import TrainingMetrics
from kubeddp.trainer.preemption import (
    STOP_NONE,
    STOP_PREEMPT,
    STOP_SAVE_FAILED,
    Preempted,
    StopVote,
)
from kubeddp.trainer.progress import Progress, fmt_duration
from kubeddp.trainer.sampler import ResumableDistributedSampler
from kubeddp.trainer.schedule import build_optimizer, build_scheduler
from kubeddp.trainer.workloads import Workload, build_workload


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _amp_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    if mode == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if mode == "fp16" and device.type != "cuda":
        raise ValueError("train.amp=fp16 needs CUDA; use bf16 or off on CPU")
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[mode]


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Trainer:
    def __init__(self, cfg: Config, ctx: DistContext, source: str = "standalone") -> None:
        self.cfg = cfg
        self.ctx = ctx
        t = cfg.train
        torch.manual_seed(t.seed)
        random.seed(t.seed)
        self.workload: Workload = build_workload(cfg.workload, t.seed)
        model = self.workload.model.to(ctx.device)
        self.raw_model = model
        if t.compile:
            model = torch.compile(model)
        if ctx.distributed:
            model = DDP(
                model,
                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                bucket_cap_mb=cfg.ddp.bucket_cap_mb,
                gradient_as_bucket_view=cfg.ddp.gradient_as_bucket_view,
                static_graph=cfg.ddp.static_graph,
                find_unused_parameters=cfg.ddp.find_unused_parameters,
            )
        self.model = model
        self.sampler = ResumableDistributedSampler(
            len(self.workload.train_set), ctx.world_size, ctx.rank, seed=t.seed
        )
        use_workers = t.num_workers > 0
        self.loader = DataLoader(
            self.workload.train_set,
            batch_size=t.batch_size,
            sampler=self.sampler,
            num_workers=t.num_workers,
            pin_memory=t.pin_memory and ctx.device.type == "cuda",
            persistent_workers=t.persistent_workers and use_workers,
            prefetch_factor=t.prefetch_factor if use_workers else None,
            drop_last=False,
        )
        self.micro_per_epoch = math.ceil(len(self.sampler) / t.batch_size)
        self.steps_per_epoch = math.ceil(self.micro_per_epoch / t.grad_accum_steps)
        total = self.steps_per_epoch * t.epochs
        self.total_steps = min(total, t.max_steps) if t.max_steps else total
        self.optimizer = build_optimizer(self.raw_model.parameters(), t)
        self.scheduler = build_scheduler(self.optimizer, t, self.total_steps)
        self.amp_dtype = _amp_dtype(t.amp, ctx.device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        self.step = 0
        self.epoch = 0
        self.consumed = 0  # global samples of the current epoch already trained
        self.sample_record: dict[int, list[int]] = {}
        self.stop_reason = STOP_NONE
        self.stop_vote = StopVote(ctx.device, ctx.distributed, cfg.checkpoint.preempt_grace_seconds)
        self._timeout_switched = False
        self._eval_step = -1
        self.first_loss: float | None = None
        self.last_loss = float("nan")
        self.val_loss: float | None = None
        self.progress = Progress(ctx.is_main, self.total_steps, t.log_every)
        self.metrics = TrainingMetrics(
            cfg.metrics, ctx.rank, ctx.world_size, ctx.backend, device=ctx.device
        )
        self.writer = (
            ckpt.AsyncCheckpointWriter(cfg.checkpoint.dir, cfg.checkpoint.keep, cfg.to_yaml())
            if ctx.is_main
            else None
        )
        self.source = source
        self.summary_file = os.environ.get(constants.ENV_SUMMARY_FILE, "") if ctx.is_main else ""
        self.step_end_unix: list[float] = []  # only filled when summary_file is set
        self.step_end_cpu: list[float] = []  # process CPU seconds (all threads) at each step end

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "world_size": self.ctx.world_size,
            "model_hash": self.cfg.model_hash(),
            "config_hash": self.cfg.config_hash(),
            "config": self.cfg.to_yaml(),
            "first_loss": self.first_loss,
        }

    def _gather(self, obj: Any) -> list[Any]:
        if not self.ctx.distributed:
            return [obj]
        out: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(out, obj)
        return out

    def save(self, blocking: bool) -> None:
        """Collective: every rank calls it at the same step; rank 0 writes."""
        rngs = self._gather(_rng_state())
        records = self._gather(self.sample_record) if self.cfg.train.record_sample_ids else None
        if self.writer is None:
            return
        start = time.perf_counter()
        state = self.writer.snapshot(self.state_dict())  # waits for the previous write
        state["rng"] = rngs
        if records is not None:
            state["sample_record"] = records
        try:
            self.writer.save(self.step, state, blocking=blocking)
        except ckpt.CheckpointError as exc:
            self._save_failed(exc)
            return
        self.metrics.on_checkpoint(
            duration_seconds=time.perf_counter() - start, timestamp=time.time()
        )

    def _save_failed(self, exc: Exception) -> None:
        policy = self.cfg.checkpoint.on_save_error
        self.progress.log(
            f"[kubeddp] checkpoint save failed: {exc} (checkpoint.on_save_error={policy})"
        )
        if policy == "stop":
            self.stop_reason = STOP_SAVE_FAILED

    def _check_writer(self) -> None:
        if self.writer is not None and not self.writer.busy:
            try:
                self.writer.wait()
            except ckpt.CheckpointError as exc:
                self._save_failed(exc)

    def resume(self) -> None:
        c = self.cfg.checkpoint
        if c.resume == "never":
            return
        directory = c.dir if c.resume == "auto" else c.resume
        path, loaded = None, None
        if self.ctx.is_main:
            found = ckpt.load_newest_valid(directory, log=self.progress.log)
            if found:
                path, loaded = str(found[0].path), found[1]
        if self.ctx.distributed:
            box = [path]
            dist.broadcast_object_list(box, src=0)
            path = box[0]
        if path is None:
            if c.resume != "auto":  # an explicit path that holds nothing is a mistake
                raise ckpt.CheckpointError(
                    f"checkpoint.resume={c.resume!r} holds no readable checkpoint; name a "
                    "checkpoint (.../ckpt-NNNNNNNN) or a directory of them, or use auto"
                )
            return
        ref = ckpt.CheckpointRef(Path(path), int(Path(path).name.split("-")[1]))
        try:
            state: dict[str, Any] | None = loaded or ckpt.load_state(ref)
        except Exception:  # noqa: BLE001 - this pod cannot see rank 0's disk; rank 0 sends it
            state = None
        if not all(self._gather(state is not None)):
            box = [state if self.ctx.is_main else None]
            dist.broadcast_object_list(box, src=0)
            state = box[0]
        assert state is not None
        self._load(state, ref)

    def _load(self, state: dict[str, Any], ref: ckpt.CheckpointRef) -> None:
        same_model = state.get("model_hash") == self.cfg.model_hash()
        if not same_model and not self.cfg.checkpoint.weights_only:
            raise ckpt.CheckpointError(
                f"checkpoint {ref.path} was written for another model (workload/model "
                "settings differ); use a new checkpoint.dir, or set "
                "checkpoint.weights_only=true to load the matching weights only"
            )
        if self.cfg.checkpoint.weights_only:
            own = self.raw_model.state_dict()
            weights = {
                k: v for k, v in state["model"].items() if k in own and own[k].shape == v.shape
            }
            self.raw_model.load_state_dict(weights, strict=False)
            self.progress.log(
                f"[kubeddp] loaded {len(weights)}/{len(own)} weight tensors from "
                f"{ref.path} (weights only; step and optimizer start fresh)"
            )
            return
        self.raw_model.load_state_dict(state["model"])
        self.step, self.epoch, self.consumed = state["step"], state["epoch"], state["consumed"]
        total = self.step + self._steps_left()
        if not self.cfg.train.max_steps and total != self.total_steps:
            # Steps were taken at another world size (elastic): the epochs left, not a step
            # count made for this world from step 0, decide the end and the LR schedule's span.
            self.total_steps = self.progress.total = total
            self.scheduler = build_scheduler(self.optimizer, self.cfg.train, total)
        self.optimizer.load_state_dict(state["optimizer"])  # after any new scheduler: its lr
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.first_loss = state.get("first_loss")
        rngs = state.get("rng") or []
        if state.get("world_size") == self.ctx.world_size and len(rngs) > self.ctx.rank:
            _set_rng_state(rngs[self.ctx.rank])
        # Old rank i's history goes to new rank i % world: none is lost when the world shrinks.
        for old_rank, record in enumerate(state.get("sample_record") or []):
            if old_rank % self.ctx.world_size == self.ctx.rank:
                for epoch, ids in record.items():
                    self.sample_record.setdefault(int(epoch), []).extend(ids)
        self.progress.log(
            f"[kubeddp] resumed from {ref.path} (step {self.step}, epoch "
            f"{self.epoch}, {self.consumed} samples into the epoch)"
        )

    def _steps_left(self) -> int:
        """Optimizer steps from (epoch, consumed) to the end of the last epoch, this world."""
        t, world = self.cfg.train, self.ctx.world_size
        if self.epoch >= t.epochs:
            return 0
        per_rank = math.ceil(max(0, self.sampler.dataset_len - self.consumed) / world)
        this_epoch = math.ceil(math.ceil(per_rank / t.batch_size) / t.grad_accum_steps)
        return this_epoch + self.steps_per_epoch * (t.epochs - self.epoch - 1)

    # ---- loop --------------------------------------------------------------------------
    def _mean_over_ranks(self, value: float) -> float:
        if not self.ctx.distributed:
            return value
        avg = torch.tensor([value], dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(avg)
        return avg.item() / self.ctx.world_size

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.amp_dtype)

    def evaluate(self) -> float | None:
        ds = self.workload.eval_set
        if ds is None or len(ds) == 0:
            return None
        sampler = ResumableDistributedSampler(
            len(ds), self.ctx.world_size, self.ctx.rank, seed=0, shuffle=False
        )
        loader = DataLoader(ds, batch_size=self.cfg.train.batch_size, sampler=sampler)
        total = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        self.model.eval()
        with torch.no_grad():
            for i, batch in enumerate(loader):
                if i >= self.cfg.train.eval_batches:
                    break
                batch = _to_device(batch, self.ctx.device)
                with self._autocast():
                    loss = self.workload.loss_fn(self.raw_model, batch)
                n = len(batch[0]) if isinstance(batch, (list, tuple)) else 1
                total += torch.tensor(
                    [loss.item() * n, n], dtype=torch.float64, device=self.ctx.device
                )
        self.model.train()
        if self.ctx.distributed:
            dist.all_reduce(total)
        self.val_loss = (total[0] / total[1].clamp(min=1)).item()
        self._eval_step = self.step
        return self.val_loss

    def _micro_step(self, batch: Any, scale: float, sync: bool) -> float:
        sync_ctx = (
            contextlib.nullcontext()
            if sync or not isinstance(self.model, DDP)
            else self.model.no_sync()
        )
        with sync_ctx:
            with self._autocast():
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

    def fit(self) -> int:
        """Train to the end (or until preempted); return the process exit code."""
        t, ctx = self.cfg.train, self.ctx
        previous = (
            signal.signal(signal.SIGTERM, self.stop_vote.on_sigterm)
            if threading.current_thread() is threading.main_thread()
            else None
        )
        self.resume()
        w = self.workload
        self.progress.log(
            f"[kubeddp] {w.description} | world size {ctx.world_size} ({ctx.backend}, "
            f"{ctx.device.type}) | batch {t.batch_size} x accum {t.grad_accum_steps} x "
            f"{ctx.world_size} ranks = {t.batch_size * t.grad_accum_steps * ctx.world_size}"
            f" samples/step | {self.total_steps} steps"
        )
        start_step = self.step
        self.progress.start = time.perf_counter()
        run_start = time.perf_counter()
        try:
            while self.step < self.total_steps and self.epoch < t.epochs:
                code = self._run_epoch()
                if code:
                    self.stop_vote.drain()
                    return code
            self.stop_vote.drain()  # a stop voted during the last step comes too late to act
            if self._eval_step != self.step:
                self.evaluate()
            self.save(blocking=True)
            self._check_writer()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        elapsed = time.perf_counter() - run_start
        steps = self.step - start_step
        self.last_loss = self._mean_over_ranks(self.last_loss)
        samples = steps * t.batch_size * t.grad_accum_steps * ctx.world_size
        sps = samples / elapsed if elapsed > 0 else 0.0
        tok = f" | {sps * w.tokens_per_sample:,.0f} tok/s" if w.tokens_per_sample else ""
        val = f" | val loss {self.val_loss:.4f}" if self.val_loss is not None else ""
        first_loss = self.first_loss if self.first_loss is not None else float("nan")
        self.progress.log(
            f"done: {self.step} steps in {fmt_duration(elapsed)} ({elapsed:.1f}s) | final loss "
            f"{self.last_loss:.4f} (start {first_loss:.4f}){val} | {sps:,.0f} samples/s{tok} | "
            f"{elapsed / max(1, steps) * 1000:.1f} ms/step"
        )
        if self.summary_file:
            self._write_summary()
        return 0 if self.stop_reason == STOP_NONE else 1

    def _write_summary(self) -> None:
        """Per-step wall-clock times for benchmarks, written atomically by rank 0."""
        t = self.cfg.train
        summary = {
            "world_size": self.ctx.world_size,
            "samples_per_step": t.batch_size * t.grad_accum_steps * self.ctx.world_size,
            "tokens_per_sample": self.workload.tokens_per_sample,
            "step_end_unix": self.step_end_unix,
            "step_end_cpu": self.step_end_cpu,
        }
        path = Path(self.summary_file)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(summary))
        tmp.replace(path)

    def _run_epoch(self) -> int:
        t, ctx = self.cfg.train, self.ctx
        self.sampler.set_epoch(self.epoch, self.consumed)
        order = list(self.sampler) if t.record_sample_ids else []
        micro_total = math.ceil(len(self.sampler) / t.batch_size)
        micro_done = 0
        accum_loss = 0.0
        group: list[int] = []
        step_start = time.perf_counter()
        data_wait = 0.0
        fetch_start = time.perf_counter()
        for batch in self.loader:
            data_wait += time.perf_counter() - fetch_start
            batch = _to_device(batch, ctx.device)
            group_size = min(t.grad_accum_steps, micro_total - (micro_done - len(group)))
            group.append(len(batch[0]) if isinstance(batch, (list, tuple)) else t.batch_size)
            last_in_group = len(group) == group_size
            accum_loss += self._micro_step(batch, 1.0 / group_size, sync=last_in_group)
            micro_done += 1
            if not last_in_group:
                fetch_start = time.perf_counter()
                continue
            self._optimizer_step()
            local_samples = sum(group)
            if order:
                pos = (micro_done - len(group)) * t.batch_size
                ids = order[pos : pos + local_samples]
                self.sample_record.setdefault(self.epoch, []).extend(ids)
            self.consumed += local_samples * ctx.world_size
            self.step += 1
            loss = accum_loss / len(group)
            if self.first_loss is None:
                self.first_loss = loss
            self.last_loss = loss
            group, accum_loss = [], 0.0
            now = time.perf_counter()
            step_seconds = now - step_start
            if self.summary_file:
                self.step_end_unix.append(time.time())
                self.step_end_cpu.append(time.process_time())
            if not self._timeout_switched:
                switch_to_training_timeout(self.cfg.ddp)
                self._timeout_switched = True
            lr = self.scheduler.get_last_lr()[0]
            sps = local_samples * ctx.world_size / step_seconds if step_seconds > 0 else 0.0
            self.metrics.on_step(
                step=self.step,
                epoch=self.epoch,
                loss=loss,
                lr=lr,
                samples=local_samples,
                tokens=local_samples * self.workload.tokens_per_sample,
                step_seconds=step_seconds,
                data_wait_seconds=data_wait,
            )
            if self.step % t.log_every == 0:
                loss = self._mean_over_ranks(loss)
            self.progress.step(
                self.step,
                self.epoch,
                loss,
                lr,
                sps,
                sps * self.workload.tokens_per_sample,
                step_seconds * 1000,
                self.step,
            )
            code = self._after_step()
            if code:
                return code
            if self.step >= self.total_steps:
                return 0
            step_start = time.perf_counter()
            data_wait = 0.0
            fetch_start = time.perf_counter()
        self.epoch += 1
        self.consumed = 0
        if t.eval_every == 0:
            val = self.evaluate()
            if val is not None:
                self.progress.log(f"eval epoch {self.epoch - 1} | val loss {val:.4f}")
        if self.step < self.total_steps and self.epoch < t.epochs:
            self.save(blocking=not self.cfg.checkpoint.async_save)
        return 0

    def _after_step(self) -> int:
        t, c = self.cfg.train, self.cfg.checkpoint
        self._check_writer()
        stop = self.stop_vote.vote(self.stop_reason)
        if stop == STOP_PREEMPT:
            self.progress.log(
                f"[kubeddp] SIGTERM: saving a checkpoint at step {self.step} before exiting"
            )
            self.stop_vote.drain()
            self.save(blocking=True)
            raise Preempted()
        if stop == STOP_SAVE_FAILED:
            self.progress.log(
                "[kubeddp] stopping: a checkpoint could not be saved "
                "(checkpoint.on_save_error=stop)"
            )
            return 1
        if t.eval_every and self.step % t.eval_every == 0:
            val = self.evaluate()
            if val is not None:
                self.progress.log(f"eval step {self.step} | val loss {val:.4f}")
        if c.every_steps and self.step % c.every_steps == 0 and self.step < self.total_steps:
            self.save(blocking=not c.async_save)
        return 0

    def close(self) -> None:
        """Drop every DDP/optimizer reference so the process group can be destroyed safely."""
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.wait()
        self.metrics.close()
        for name in (
            "model",
            "raw_model",
            "optimizer",
            "scheduler",
            "scaler",
            "loader",
            "workload",
            "writer",
        ):
            setattr(self, name, None)
