"""A user's program's own training state in each pod's memory, as the built-in trainer's is
(kubeddp.api.register_state / report_step): taken every so many steps, restored at start from
the newest snapshot any rank holds (worker/snapshot/).

The program names its state as objects with `state_dict()` / `load_state_dict(state)` (torch's
Stateful protocol: modules, optimizers, LR schedulers, GradScalers, ...) or plain dicts (their
items are restored in place); each rank's RNG streams (torch, Python, CUDA) are added. An
optimizer's step waits for a snapshot's background copy of what it changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from kubeddp.trainer import process_contract
from kubeddp.trainer.worker.checkpoint.parts import RngPart
from kubeddp.trainer.worker.snapshot.taker import SnapshotTaker, for_worker, updated_by

RNG = "rng"  # the per-rank part added to every program's state
STEP = "step"


class ProgramStateError(ValueError):
    """What the program registered cannot be snapshotted (one line, at registration)."""


def _check(parts: Mapping[str, Any]) -> None:
    if not parts:
        raise ProgramStateError("register_state() needs the state to keep, e.g. model=model")
    for name, part in parts.items():
        if name in (RNG, STEP):
            raise ProgramStateError(f"{name!r} is kubeddp's own name in the state: use another")
        stateful = callable(getattr(part, "state_dict", None)) and callable(
            getattr(part, "load_state_dict", None)
        )
        if not stateful and not isinstance(part, dict):
            raise ProgramStateError(
                f"{name}={type(part).__name__}: give objects with state_dict() and "
                "load_state_dict() (a model, an optimizer, ...) or a dict"
            )


def _device(parts: Mapping[str, Any]) -> torch.device:
    for part in parts.values():
        if isinstance(part, torch.nn.Module):
            for parameter in part.parameters():
                return parameter.device
    return torch.device("cpu")


class ProgramState:
    """The registered parts and this rank's snapshot taker."""

    def __init__(self, parts: dict[str, Any], taker: SnapshotTaker) -> None:
        self.parts = parts
        self.taker = taker
        self.rng = RngPart()
        self.optimizers = [p for p in parts.values() if isinstance(p, torch.optim.Optimizer)]
        taker.guard(self.optimizers)

    def _state(self, step: int) -> dict[str, Any]:
        state: dict[str, Any] = {STEP: step}
        for name, part in self.parts.items():
            state[name] = dict(part) if isinstance(part, dict) else part.state_dict()
        return state

    def restore(self) -> int | None:
        """Collective: the newest state any rank holds, loaded into the parts; its step, or
        None when no rank holds one (the program then loads its own checkpoint, as before)."""
        restored = self.taker.restore(None, lambda run: None if run == self.taker.run else
                                      "it was taken by another program or state")  # fmt: skip
        if restored is None:
            self.taker.start(0)
            return None
        state = restored.state
        for name, part in self.parts.items():
            if isinstance(part, dict):
                part.clear()
                part.update(state[name])
            else:
                part.load_state_dict(state[name])
        rank, world = _rank_and_world()
        self.rng.load_rank_states(state.get(RNG) or [], rank, world)
        step = int(state[STEP])
        self.taker.start(step)
        if rank == 0:
            print(f"[kubeddp] resumed from {restored.source} (step {step})", flush=True)
        return step

    def after_step(self, step: int) -> None:
        """Every rank, every step (report_step): a snapshot when the cadence says so."""
        if self.taker.due(step):
            updated = [t for o in self.optimizers for t in updated_by(o)]
            self.taker.take(step, lambda: self._state(step), {RNG: self.rng.state_dict()}, updated)

    def close(self) -> None:
        self.taker.close()


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def register(parts: dict[str, Any]) -> ProgramState | None:
    """The program's state under kubeddp launch, or None (plain torchrun, or
    checkpoint.memory_snapshots off). Raises ProgramStateError for parts it cannot keep."""
    _check(parts)
    cfg = process_contract.resolved_config(os.environ)
    if cfg is None:
        return None
    identity = json.dumps([sys.argv, sorted(parts)], default=str)
    run = {"program": hashlib.sha256(identity.encode()).hexdigest()[:16]}
    taker = for_worker(cfg.checkpoint, _device(parts), run, _say)
    return ProgramState(dict(parts), taker) if taker is not None else None


def _say(line: str) -> None:
    if _rank_and_world()[0] == 0:
        print(line, flush=True)
