"""The checkpoint manager: what a checkpoint holds, when one is saved, and resuming from one.

Saving is collective: every rank sends rank 0 its RNG state (and its sample record, when
kept) and rank 0 writes, in the background unless asked to block. Resuming reads the newest
readable checkpoint on rank 0 and sends it to any rank that cannot read it itself.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kubeddp.trainer import yaml_io
from kubeddp.trainer.config import Config
from kubeddp.trainer.worker import checkpoint as ckpt
from kubeddp.trainer.worker.checkpoint_lock import WriterLock
from kubeddp.trainer.worker.distributed import DistContext, broadcast_object, gather_objects
from kubeddp.trainer.worker.metrics import TrainingMetrics
from kubeddp.trainer.worker.observer import SampleIdRecorder
from kubeddp.trainer.worker.preemption import STOP_NONE, STOP_SAVE_FAILED
from kubeddp.trainer.worker.schedule import restore_optimizer
from kubeddp.trainer.worker.steps import TrainState


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


def _seed_of(state: dict[str, Any]) -> int | None:
    """train.seed of the run that wrote `state` (older checkpoints: from their config copy)."""
    if isinstance(state.get("seed"), int):
        return state["seed"]
    try:
        config = yaml_io.load_one(str(state.get("config") or ""), "the checkpoint's config")
    except yaml_io.YamlInputError:
        return None
    train = config.get("train") if isinstance(config, dict) else None
    seed = train.get("seed") if isinstance(train, dict) else None
    return seed if isinstance(seed, int) else None


class CheckpointManager:
    def __init__(
        self,
        cfg: Config,
        ctx: DistContext,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler,
        *,
        metrics: TrainingMetrics,
        log: Callable[[str], None],
        sample_ids: SampleIdRecorder | None = None,
        before_save: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.model = model  # unwrapped: its keys do not depend on DDP or torch.compile
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.metrics = metrics
        self.log = log
        self.sample_ids = sample_ids
        self.before_save = before_save  # the loop settles what it keeps on the device
        c = cfg.checkpoint
        self.writer = (
            ckpt.AsyncCheckpointWriter(c.dir, c.keep, cfg.to_yaml()) if ctx.is_main else None
        )
        self.lock = WriterLock(c.dir) if ctx.is_main else None
        self.stop_reason = STOP_NONE  # STOP_SAVE_FAILED once a save fails under policy "stop"

    # ---- save --------------------------------------------------------------------------
    def state_dict(self, state: TrainState) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": state.step,
            "epoch": state.epoch,
            "consumed": state.consumed,
            "world_size": self.ctx.world_size,
            "model_hash": self.cfg.model_hash(),
            "config_hash": self.cfg.config_hash(),
            "config": self.cfg.to_yaml(),
            "seed": self.cfg.train.seed,
            "first_loss": state.first_loss,
        }

    def maybe_save(self, state: TrainState, *, epoch_end: bool = False) -> None:
        """Save at the end of an epoch and every checkpoint.every_steps steps (collective)."""
        every = self.cfg.checkpoint.every_steps
        if epoch_end or (every and state.step % every == 0):
            self.save(state, blocking=not self.cfg.checkpoint.async_save)

    def save(self, state: TrainState, *, blocking: bool) -> None:
        """Collective: every rank calls it at the same step; rank 0 writes."""
        if self.before_save is not None:
            self.before_save()
        rngs = gather_objects(_rng_state())
        records = gather_objects(self.sample_ids.record) if self.sample_ids else None
        if self.writer is None:
            return
        start = time.perf_counter()
        snapshot = self.writer.snapshot(self.state_dict(state))  # waits for the previous write
        snapshot["rng"] = rngs
        if records is not None:
            snapshot["sample_record"] = records
        try:
            self.writer.save(state.step, snapshot, blocking=blocking)
        except ckpt.CheckpointError as exc:
            self._save_failed(exc)
            return
        self.metrics.on_checkpoint(
            duration_seconds=time.perf_counter() - start, timestamp=time.time()
        )

    def check_writer(self) -> None:
        """Report a background save that failed (cheap: only looks at a finished write)."""
        if self.writer is not None and not self.writer.busy:
            try:
                self.writer.wait()
            except ckpt.CheckpointError as exc:
                self._save_failed(exc)

    def _save_failed(self, exc: Exception) -> None:
        policy = self.cfg.checkpoint.on_save_error
        self.log(f"[kubeddp] checkpoint save failed: {exc} (checkpoint.on_save_error={policy})")
        if policy == "stop":
            self.stop_reason = STOP_SAVE_FAILED

    def close(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.wait()
        if self.lock is not None:
            self.lock.release()

    # ---- the directory -------------------------------------------------------------------
    def claim_directory(self) -> None:
        """Collective, before anything is read or written: rank 0 takes checkpoint.dir's
        writer lock and copies the config there; a directory that is a file, or that another
        live run holds, ends every rank with the same one-line CheckpointError."""
        problem = None
        if self.lock is not None:
            try:
                warning = self.lock.acquire()
            except ckpt.CheckpointError as exc:
                problem = str(exc)
            else:
                if warning:
                    self.log(warning)
                if self.lock.held:
                    self._write_config_copy()
        problem = broadcast_object(problem)
        if problem:
            raise ckpt.CheckpointError(problem)

    def _write_config_copy(self) -> None:
        """The effective config next to the checkpoints: what produced them, for a person."""
        path = Path(self.cfg.checkpoint.dir) / "config.yaml"
        try:
            path.write_text(self.cfg.to_yaml())
        except OSError as exc:
            self.log(f"[kubeddp] warning: cannot write {path}: {exc.strerror}")

    def _set_aside(self, ref: ckpt.CheckpointRef) -> None:
        """A bad checkpoint in our own directory moves out of the way (kept, never deleted):
        the resumed run would otherwise replace it when it saves the same step again."""
        moved = ckpt.set_aside(ref)
        if moved is not None:
            self.log(f"[kubeddp] kept the bad checkpoint for inspection as {moved}")

    def _content_problem(self, state: dict[str, Any]) -> str | None:
        """What makes a checkpoint of this model unusable beyond its layout: tensor names or
        shapes, or optimizer groups, that are not this model's (another model is reported as
        such by _load; weights_only takes what fits)."""
        if self.cfg.checkpoint.weights_only or state.get("model_hash") != self.cfg.model_hash():
            return None
        own = self.model.state_dict()
        theirs = state["model"]
        if set(theirs) != set(own):
            return f"its model has {len(theirs)} tensors by other names than this model's"
        for name, tensor in own.items():
            if theirs[name].shape != tensor.shape:
                return f"its tensor {name} has shape {tuple(theirs[name].shape)}"
        groups = state["optimizer"].get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(self.optimizer.param_groups):
            return "its optimizer state does not fit this model"
        return None

    # ---- resume ------------------------------------------------------------------------
    def resume(self) -> TrainState | None:
        """Claim checkpoint.dir, then load what checkpoint.resume names (collective); the state
        to continue from, or None to start at step 0 (nothing to resume, or weights only)."""
        self.claim_directory()
        c = self.cfg.checkpoint
        if c.resume == "never":
            return None
        directory = c.dir if c.resume == "auto" else c.resume
        own_directory = self.lock is not None and self.lock.held and c.resume == "auto"
        path, loaded = None, None
        if self.ctx.is_main:
            found = ckpt.load_newest_valid(
                directory,
                log=self.log,
                check=self._content_problem,
                on_bad=self._set_aside if own_directory else None,
            )
            if found:
                path, loaded = str(found[0].path), found[1]
        path = broadcast_object(path)
        if path is None:
            if c.resume != "auto":  # an explicit path that holds nothing is a mistake
                raise ckpt.CheckpointError(
                    f"checkpoint.resume={c.resume!r} holds no readable checkpoint; name a "
                    "checkpoint (.../ckpt-NNNNNNNN) or a directory of them, or use auto"
                )
            return None
        ref = ckpt.CheckpointRef(Path(path), int(Path(path).name.split("-")[1]))
        try:
            state: dict[str, Any] | None = loaded or ckpt.load_state(ref)
        except Exception:  # noqa: BLE001 - this pod cannot see rank 0's disk; rank 0 sends it
            state = None
        if state is not None and loaded is None and self._unusable(state):
            state = None  # this rank's copy differs from what rank 0 checked; take rank 0's
        if not all(gather_objects(state is not None)):
            state = broadcast_object(state if self.ctx.is_main else None)
        assert state is not None
        return self._load(state, ref)

    def _unusable(self, state: dict[str, Any]) -> bool:
        return (ckpt.state_problem(state) or self._content_problem(state)) is not None

    def _load(self, state: dict[str, Any], ref: ckpt.CheckpointRef) -> TrainState | None:
        try:
            return self._restore(state, ref)
        except ckpt.CheckpointError:
            raise
        except (KeyError, RuntimeError, TypeError, ValueError) as exc:
            raise ckpt.CheckpointError(
                f"checkpoint {ref.path} cannot be restored ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:200]}); move it out of checkpoint.dir, or set "
                "checkpoint.resume=never to start afresh"
            ) from None

    def _restore(self, state: dict[str, Any], ref: ckpt.CheckpointRef) -> TrainState | None:
        weights_only = self.cfg.checkpoint.weights_only
        if state.get("model_hash") != self.cfg.model_hash() and not weights_only:
            raise ckpt.CheckpointError(
                f"checkpoint {ref.path} was written for another model (workload/model "
                "settings differ); use a new checkpoint.dir, or set "
                "checkpoint.weights_only=true to load the matching weights only"
            )
        seed = _seed_of(state)
        if not weights_only and seed is not None and seed != self.cfg.train.seed:
            # The seed decides the data order: resuming the position of one order in another
            # would train some samples twice and skip others.
            raise ckpt.CheckpointError(
                f"checkpoint {ref.path} was written with train.seed={seed}, this run has "
                f"train.seed={self.cfg.train.seed}; resuming would train some samples twice "
                f"and skip others: set train.seed={seed} to resume, or start afresh with "
                "checkpoint.resume=never or another checkpoint.dir"
            )
        if weights_only:
            own = self.model.state_dict()
            weights = {
                k: v for k, v in state["model"].items() if k in own and own[k].shape == v.shape
            }
            self.model.load_state_dict(weights, strict=False)
            self.log(
                f"[kubeddp] loaded {len(weights)}/{len(own)} weight tensors from "
                f"{ref.path} (weights only; step and optimizer start fresh)"
            )
            return None
        self.model.load_state_dict(state["model"])
        restore_optimizer(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        rngs = state.get("rng") or []
        if state.get("world_size") == self.ctx.world_size and len(rngs) > self.ctx.rank:
            _set_rng_state(rngs[self.ctx.rank])
        if self.sample_ids is not None:
            self.sample_ids.restore(
                state.get("sample_record") or [], self.ctx.rank, self.ctx.world_size
            )
        resumed = TrainState(
            step=state["step"],
            epoch=state["epoch"],
            consumed=state["consumed"],
            first_loss=state.get("first_loss"),
        )
        self.log(
            f"[kubeddp] resumed from {ref.path} (step {resumed.step}, epoch "
            f"{resumed.epoch}, {resumed.consumed} samples into the epoch)"
        )
        return resumed
