"""The parts of a checkpoint: anything with `state_dict()` / `load_state_dict(state)`.

The manager keeps a mapping name -> part; each part is saved under its name in state.pt and
restored from it. A new piece of state is one line in that mapping (trainer/worker/loop.py).
Two kinds of part:
- `Stateful`: one state for the whole job, taken from rank 0 (model, optimizer, ...).
- `PerRank`: every rank has its own (RNG streams, sample records): the manager gathers all
  ranks' states into a list on save and hands each rank the whole list on load.
The trainer's progress (step, epoch, position in the epoch) is the part named `trainer`; its
keys sit at the top of state.pt, where every kubeddp checkpoint has kept them.
"""

from __future__ import annotations

import random
from typing import Any, Protocol, runtime_checkable

import torch

from kubeddp.trainer.worker.observer import SampleIdRecorder
from kubeddp.trainer.worker.schedule import restore_optimizer

TOP_LEVEL = "trainer"  # the part whose keys are not nested under its name


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


@runtime_checkable
class PerRank(Protocol):
    def state_dict(self) -> Any: ...

    def load_rank_states(self, states: list[Any], rank: int, world_size: int) -> None: ...


class OptimizerPart:
    """An optimizer restored with this run's kernel choice (schedule.restore_optimizer)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_optimizer(self.optimizer, state)


class RngPart:
    """This rank's RNG streams (torch, Python, CUDA): restored only at the same world size,
    where rank i continues rank i's streams."""

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_rank_states(self, states: list[Any], rank: int, world_size: int) -> None:
        if len(states) != world_size or len(states) <= rank:
            return
        state = states[rank]
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


class SampleRecordPart:
    """train.record_sample_ids: every rank's record of the samples it trained."""

    def __init__(self, recorder: SampleIdRecorder) -> None:
        self.recorder = recorder

    def state_dict(self) -> dict[int, list[int]]:
        return self.recorder.record

    def load_rank_states(self, states: list[Any], rank: int, world_size: int) -> None:
        self.recorder.restore(states or [], rank, world_size)
