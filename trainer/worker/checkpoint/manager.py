"""The checkpoint manager: what a checkpoint holds, when one is saved, and resuming from one.

It holds a mapping of parts (parts.py): each saved under its name, restored from it. Saving is
collective: every rank sends rank 0 its per-rank parts (RNG, sample record) and rank 0 writes,
in the background unless asked to block. Resuming reads the newest readable checkpoint on rank
0 and sends it to any rank that cannot read it itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeddp.trainer import exit_codes, storage_rules, yaml_io
from kubeddp.trainer.config import CheckpointConfig
from kubeddp.trainer.worker.checkpoint import safety
from kubeddp.trainer.worker.checkpoint.backends import storage_for
from kubeddp.trainer.worker.checkpoint.parts import TOP_LEVEL, PerRank, Stateful
from kubeddp.trainer.worker.checkpoint.state import (
    load_newest_valid,
    load_state,
    state_problem,
)
from kubeddp.trainer.worker.checkpoint.storage import (
    CheckpointError,
    CheckpointRef,
    CheckpointStorage,
    StorageUnreachable,
)
from kubeddp.trainer.worker.checkpoint.writer import AsyncCheckpointWriter
from kubeddp.trainer.worker.distributed import DistContext, broadcast_object, gather_objects
from kubeddp.trainer.worker.metrics import TrainingMetrics
from kubeddp.trainer.worker.preemption import STOP_NONE, STOP_SAVE_FAILED


@dataclass(frozen=True)
class RunInfo:
    """What a checkpoint records of the run that wrote it (checked on resume): hashes and a
    copy of the whole config, made by the Trainer that holds it."""

    model_hash: str
    config_hash: str
    config_yaml: str
    seed: int


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
        settings: CheckpointConfig,
        ctx: DistContext,
        run: RunInfo,
        parts: Mapping[str, Stateful | PerRank],
        *,
        metrics: TrainingMetrics,
        log: Callable[[str], None],
        before_save: Callable[[], None] | None = None,
        after_save: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.ctx = ctx
        self.run = run
        self.parts = dict(parts)  # `model` is unwrapped: its keys do not depend on DDP/compile
        self.metrics = metrics
        self.log = log
        self.before_save = before_save  # the loop settles what it keeps on the device
        self.after_save = after_save  # rank 0, once a save is handed to the writer (the curves)
        self.storage: CheckpointStorage | None = None  # checkpoint.dir, opened by claim
        self.writer: AsyncCheckpointWriter | None = None  # rank 0 only
        self.claimed = False  # rank 0 holds checkpoint.dir as its writer
        self.stop_reason = STOP_NONE  # STOP_SAVE_FAILED once a save fails under policy "stop"
        self.final_failed = False
        self.unreachable = False  # the last failed save found the storage unreachable
        self._apart_pending = False  # move another run's checkpoints aside at the first save

    # ---- save --------------------------------------------------------------------------
    def _own_state(self) -> dict[str, Any]:
        """Rank 0's parts, and what the checkpoint records of the run."""
        state: dict[str, Any] = {}
        for name, part in self.parts.items():
            if isinstance(part, PerRank):
                continue
            if name == TOP_LEVEL:
                state.update(part.state_dict())
            else:
                state[name] = part.state_dict()
        state.update(
            world_size=self.ctx.world_size,
            model_hash=self.run.model_hash,
            config_hash=self.run.config_hash,
            config=self.run.config_yaml,
            seed=self.run.seed,
        )
        return state

    def maybe_save(self, state: Any, *, epoch_end: bool = False) -> None:
        """Save at the end of an epoch and every checkpoint.every_steps steps (collective)."""
        every = self.settings.every_steps
        if epoch_end or (every and state.step % every == 0):
            self.save(state, blocking=not self.settings.async_save)

    def save(self, state: Any, *, blocking: bool, final: bool = False) -> None:
        """Collective: every rank calls it at the same step; rank 0 writes. `state` is the
        trainer's progress (its `step` names the checkpoint). A failed `final` save fails the
        run whatever checkpoint.on_save_error says: its result would not be on disk."""
        if self.before_save is not None:
            self.before_save()
        gathered = {
            name: gather_objects(part.state_dict())
            for name, part in self.parts.items()
            if isinstance(part, PerRank)
        }
        if self.writer is not None:
            saved = self._write(state.step, gathered, blocking)
            self.final_failed = final and not saved
        if final:
            failed, unreachable = broadcast_object((self.final_failed, self.unreachable))
            self.final_failed, self.unreachable = bool(failed), bool(unreachable)

    def _write(self, step: int, gathered: dict[str, Any], blocking: bool) -> bool:
        """Rank 0: hand this step's state to the writer; False when the save failed."""
        assert self.writer is not None
        if self._apart_pending:  # until the other run's checkpoints moved, write nothing
            try:
                self._keep_apart()
            except CheckpointError as exc:
                self._save_failed(exc)
                return False
            self._apart_pending = False
        try:  # the previous background write first: its error is its own, not this save's
            self.writer.wait()
        except CheckpointError as exc:
            self._save_failed(exc)
        start = time.perf_counter()
        snapshot = self.writer.snapshot(self._own_state())  # waits for the previous write
        snapshot.update(gathered)
        try:
            self.writer.save(step, snapshot, blocking=blocking)
        except CheckpointError as exc:
            self._save_failed(exc)
            return False
        self.metrics.on_checkpoint(
            duration_seconds=time.perf_counter() - start, timestamp=time.time()
        )
        if self.after_save is not None:
            self.after_save()
        return True

    def check_writer(self) -> None:
        """Report a background save that failed (cheap: only looks at a finished write)."""
        if self.writer is not None and not self.writer.busy:
            try:
                self.writer.wait()
            except CheckpointError as exc:
                self._save_failed(exc)

    def _save_failed(self, exc: Exception) -> None:
        self.unreachable = isinstance(exc, StorageUnreachable)  # throttled, endpoint down
        policy = self.settings.on_save_error
        self.log(f"[kubeddp] checkpoint save failed: {exc} (checkpoint.on_save_error={policy})")
        if policy == "stop":
            self.stop_reason = STOP_SAVE_FAILED

    def exit_code(self) -> int:
        """The run's exit code once training ended: fatal when a save stopped it, or when the
        final checkpoint (the run's result) is not on disk."""
        if self.final_failed:
            self.log(
                "[kubeddp] error: the final checkpoint could not be saved, so this run's result "
                "is not on disk; fix checkpoint.dir (space, permissions) and run again: it "
                "resumes from the newest checkpoint"
            )
        if self.final_failed and self.unreachable:  # not the run's fault: retried
            return exit_codes.STORAGE_UNREACHABLE
        if self.stop_reason != STOP_NONE or self.final_failed:
            return exit_codes.TRAINING_FAILED
        return exit_codes.OK

    def close(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.wait()
        if self.claimed and self.storage is not None:
            self.storage.release()
            self.claimed = False

    # ---- the directory -------------------------------------------------------------------
    def claim_directory(self) -> None:
        """Collective, before anything is read or written: rank 0 claims checkpoint.dir as its
        writer (safety.claim); a directory it may not write ends every rank with the same
        one-line CheckpointError."""
        problem: tuple[bool, str] | None = None
        local_problem = None
        try:
            self.storage = storage_for(self.settings.dir)
        except CheckpointError as exc:
            local_problem = (isinstance(exc, StorageUnreachable), str(exc))
        if self.ctx.is_main:
            problem = local_problem
            if self.storage is not None:
                try:
                    safety.claim(self.storage, self.run.config_yaml, self.log)
                except CheckpointError as exc:
                    problem = (isinstance(exc, StorageUnreachable), str(exc))
                else:
                    self.claimed = True
                    s = self.settings
                    self.writer = AsyncCheckpointWriter(self.storage, s.keep, self.run.config_yaml)
        problem = broadcast_object(problem) or local_problem
        if problem:
            retry, message = problem
            raise (StorageUnreachable if retry else CheckpointError)(message)

    def _set_aside(self, ref: CheckpointRef) -> None:
        """A bad checkpoint in our own directory moves out of the way (kept, never deleted):
        the resumed run would otherwise replace it when it saves the same step again."""
        assert self.storage is not None
        moved = self.storage.set_aside(ref, ".bad")
        if moved is not None:
            self.log(f"[kubeddp] kept the bad checkpoint for inspection as {moved}")

    def _content_problem(self, state: dict[str, Any]) -> str | None:
        """What makes a checkpoint of this model unusable beyond its layout: tensor names or
        shapes, or optimizer groups, that are not this model's (another model is reported as
        such by _load; weights_only takes what fits)."""
        if self.settings.weights_only or state.get("model_hash") != self.run.model_hash:
            return None
        own = self.parts["model"].state_dict()
        theirs = state["model"]
        if set(theirs) != set(own):
            return f"its model has {len(theirs)} tensors by other names than this model's"
        for name, tensor in own.items():
            if theirs[name].shape != tensor.shape:
                return f"its tensor {name} has shape {tuple(theirs[name].shape)}"
        groups = state["optimizer"].get("param_groups")
        optimizer = self.parts["optimizer"].state_dict()
        if not isinstance(groups, list) or len(groups) != len(optimizer["param_groups"]):
            return "its optimizer state does not fit this model"
        return None

    # ---- resume ------------------------------------------------------------------------
    def resume(self) -> Any | None:
        """Claim checkpoint.dir, then load what checkpoint.resume names (collective); the
        trainer part to continue from, or None to start at step 0 (nothing to resume, or
        weights only)."""
        self.claim_directory()
        c = self.settings
        if c.resume == "never":
            self._apart_pending = True
            return None
        own = c.resume == "auto"
        source = self.storage if own else storage_for(c.resume)
        assert source is not None
        found_at, loaded, unreachable = None, None, None
        if self.ctx.is_main:
            try:
                found = load_newest_valid(
                    source,
                    log=self.log,
                    check=self._content_problem,
                    on_bad=self._set_aside if own and self.claimed else None,
                )
            except StorageUnreachable as exc:
                found, unreachable = None, str(exc)
            if found:
                found_at, loaded = (str(found[0].path), found[0].step), found[1]
        found_at, unreachable = broadcast_object((found_at, unreachable))
        if unreachable:
            raise StorageUnreachable(unreachable)
        if found_at is None:
            if not own:  # an explicit path that holds nothing is a mistake
                raise CheckpointError(
                    f"checkpoint.resume={c.resume!r} holds no readable checkpoint; name a "
                    "checkpoint (.../ckpt-NNNNNNNN) or a directory of them, or use auto"
                )
            self._apart_pending = True
            return None
        where, step = found_at
        local = storage_rules.is_directory(where)
        ref = CheckpointRef(Path(where) if local else where, step, source)
        try:
            state: dict[str, Any] | None = loaded or load_state(ref)
        except Exception:  # noqa: BLE001 - this pod cannot see rank 0's disk; rank 0 sends it
            state = None
        if state is not None and loaded is None and self._unusable(state):
            state = None  # this rank's copy differs from what rank 0 checked; take rank 0's
        if not all(gather_objects(state is not None)):
            state = broadcast_object(state if self.ctx.is_main else None)
        assert state is not None
        resumed = self._load(state, ref)
        self._apart_pending = not (own and resumed is not None)
        return resumed

    def _keep_apart(self) -> None:
        """A run that does not continue checkpoint.dir's newest checkpoint (resume=never,
        another path, weights only) moves the checkpoints already there aside before its first
        save: keep-last-N would otherwise prune this run's new ones (lower steps) right after
        writing them, and a retry would resume the other run. Nothing is deleted."""
        if not self.claimed or self.storage is None:
            return
        moved = safety.keep_apart(self.storage)
        if moved:
            self.log(
                f"[kubeddp] checkpoint.dir {self.storage.location} held {len(moved)} "
                f"checkpoint(s) of another run; kept them as {moved[0]}"
                + (f" and {len(moved) - 1} more" if len(moved) > 1 else "")
                + " (delete them when no longer needed)"
            )

    def _unusable(self, state: dict[str, Any]) -> bool:
        return (state_problem(state) or self._content_problem(state)) is not None

    def _load(self, state: dict[str, Any], ref: CheckpointRef) -> Any | None:
        try:
            return self._restore(state, ref)
        except CheckpointError:
            raise
        except (KeyError, RuntimeError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint {ref.path} cannot be restored ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:200]}); move it out of checkpoint.dir, or set "
                "checkpoint.resume=never to start afresh"
            ) from None

    def _restore(self, state: dict[str, Any], ref: CheckpointRef) -> Any | None:
        weights_only = self.settings.weights_only
        if state.get("model_hash") != self.run.model_hash and not weights_only:
            raise CheckpointError(
                f"checkpoint {ref.path} was written for another model (workload/model "
                "settings differ); use a new checkpoint.dir, or set "
                "checkpoint.weights_only=true to load the matching weights only"
            )
        seed = _seed_of(state)
        if not weights_only and seed is not None and seed != self.run.seed:
            # The seed decides the data order: resuming the position of one order in another
            # would train some samples twice and skip others.
            raise CheckpointError(
                f"checkpoint {ref.path} was written with train.seed={seed}, this run has "
                f"train.seed={self.run.seed}; resuming would train some samples twice "
                f"and skip others: set train.seed={seed} to resume, or start afresh with "
                "checkpoint.resume=never or another checkpoint.dir"
            )
        model = self.parts["model"]
        if weights_only:
            own = model.state_dict()
            weights = {
                k: v for k, v in state["model"].items() if k in own and own[k].shape == v.shape
            }
            model.load_state_dict(weights, strict=False)
            self.log(
                f"[kubeddp] loaded {len(weights)}/{len(own)} weight tensors from "
                f"{ref.path} (weights only; step and optimizer start fresh)"
            )
            return None
        for name, part in self.parts.items():
            if isinstance(part, PerRank):
                part.load_rank_states(state.get(name) or [], self.ctx.rank, self.ctx.world_size)
            elif name == TOP_LEVEL:
                part.load_state_dict(state)
            elif name in state:  # a part added since this checkpoint was written starts fresh
                part.load_state_dict(state[name])
        trainer = self.parts[TOP_LEVEL]
        self.log(
            f"[kubeddp] resumed from {ref.path} (step {trainer.step}, epoch "
            f"{trainer.epoch}, {trainer.consumed} samples into the epoch)"
        )
        return trainer
