"""The manager's mapping of parts (trainer/worker/checkpoint/parts.py): a new piece of state is
one line, saved under its name and restored by resume; a checkpoint written before the part
existed leaves it as it is; the sampler part refuses a dataset of another size. Reading never
blocks on a FIFO planted as the newest state.pt."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from kubeddp.trainer.config import load_config
from kubeddp.trainer.worker import checkpoint as ckpt
from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.loop import Trainer

pytestmark = pytest.mark.timeout(120)
CPU = DistContext(0, 1, torch.device("cpu"), "gloo")


class Tokens:
    """A new piece of trainer state, as a maintainer would add one (e.g. tokens seen)."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def _trainer(ckpt_dir: Path, *overrides: str) -> Trainer:
    settings = [
        "workload.name=regression",
        "workload.samples=400",
        "train.batch_size=30",
        "train.max_steps=8",
        f"checkpoint.dir={ckpt_dir}",
        "checkpoint.every_steps=4",
        "checkpoint.async_save=false",
        "metrics.enabled=false",
        *overrides,
    ]
    return Trainer(load_config(None, settings), CPU)


def test_a_new_part_is_one_line_and_is_resumed(tmp_path: Path) -> None:
    first = _trainer(tmp_path)
    first.checkpoints.parts["tokens"] = Tokens()  # the one line
    first.checkpoints.parts["tokens"].seen = 1234
    try:
        assert first.fit() == 0
    finally:
        first.close()
    assert ckpt.load_state(ckpt.list_checkpoints(tmp_path)[0])["tokens"] == {"seen": 1234}
    again = _trainer(tmp_path, "train.max_steps=12")
    again.checkpoints.parts["tokens"] = tokens = Tokens()
    resumed = again.checkpoints.resume()
    again.close()
    assert resumed is not None and resumed.step == 8
    assert tokens.seen == 1234


def test_a_checkpoint_older_than_a_part_leaves_that_part_fresh(tmp_path: Path) -> None:
    first = _trainer(tmp_path)
    try:
        assert first.fit() == 0
    finally:
        first.close()
    again = _trainer(tmp_path, "train.max_steps=12")
    again.checkpoints.parts["tokens"] = tokens = Tokens()
    assert again.checkpoints.resume() is not None
    again.close()
    assert tokens.seen == 0


def test_a_dataset_of_another_size_is_refused_by_the_sampler_part(tmp_path: Path) -> None:
    first = _trainer(tmp_path)
    try:
        assert first.fit() == 0
    finally:
        first.close()
    other = _trainer(tmp_path, "train.max_steps=12", "workload.samples=500")
    with pytest.raises(ckpt.CheckpointError, match="training samples, this run has"):
        other.checkpoints.resume()
    other.close()


def test_a_fifo_as_the_newest_state_is_skipped_without_blocking(tmp_path: Path) -> None:
    state = {key: kind() for key, kind in ckpt.REQUIRED_KEYS.items()}
    ckpt.write_checkpoint(tmp_path, 5, {**state, "step": 5}, "", keep=3)
    newest = Path(ckpt.write_checkpoint(tmp_path, 10, {**state, "step": 10}, "", keep=3))
    os.unlink(newest / ckpt.STATE_FILE)
    os.mkfifo(newest / ckpt.STATE_FILE)
    messages: list[str] = []
    result: list[Any] = []
    reader = threading.Thread(
        target=lambda: result.append(ckpt.load_newest_valid(tmp_path, log=messages.append)),
        daemon=True,
    )
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert "is not a regular file" in messages[0]
    assert result[0] is not None and result[0][0].step == 5, "the previous one is used"


def _stateful(value: Any) -> bool:
    return isinstance(value, (ckpt.parts.Stateful, ckpt.parts.PerRank))


def held_state(trainer: Any) -> dict[str, Any]:
    """`attribute` (and `attribute.field` one level into its components, list items too) ->
    every object a trainer holds that has a state of its own (state_dict and a loader)."""
    found: dict[str, Any] = {}

    def visit(path: str, value: Any, depth: int) -> None:
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(f"{path}[{i}]", item, depth)
            return
        if _stateful(value):
            found[path] = value
        if depth and hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
            for name, inner in vars(value).items():
                visit(f"{path}.{name}", inner, depth - 1)

    for name, value in vars(trainer).items():
        visit(name, value, 1)
    return found


def _parameters(value: Any) -> set[int]:
    return {id(p) for p in value.parameters()} if isinstance(value, torch.nn.Module) else set()


def unsaved_state(trainer: Any) -> list[str]:
    """What the trainer holds with a state that no checkpoint part saves: not a part, not an
    object a part adapts (OptimizerPart.optimizer, SampleRecordPart.recorder), not a wrapper
    of a saved module (DDP, torch.compile: the same parameters)."""
    parts = trainer.checkpoints.parts.values()
    saved = {id(p) for p in parts} | {id(v) for p in parts for v in vars(p).values()}
    saved_parameters = [_parameters(p) for p in parts if _parameters(p)]
    return sorted(
        path
        for path, value in held_state(trainer).items()
        if id(value) not in saved and _parameters(value) not in saved_parameters
    )


def adapters_in_parts_py() -> set[type]:
    """The part classes parts.py defines (its protocols aside)."""
    module = ckpt.parts
    return {
        cls
        for cls in vars(module).values()
        if isinstance(cls, type)
        and cls.__module__ == module.__name__
        and cls not in (module.Stateful, module.PerRank)
    }


def test_every_state_a_trainer_holds_is_a_checkpoint_part(tmp_path: Path) -> None:
    """A new piece of state left out of the parts mapping (trainer/worker/loop.py) would not be
    saved, and a resume would silently start it over."""
    trainer = _trainer(tmp_path, "train.record_sample_ids=true")
    try:
        assert unsaved_state(trainer) == []
        trainer.tokens = Tokens()  # the forgotten line: state the mapping does not name
        assert unsaved_state(trainer) == ["tokens"]
    finally:
        trainer.close()


def test_every_part_class_is_in_the_mapping(tmp_path: Path) -> None:
    """A part written in parts.py but left out of the mapping is caught (every optional state
    on: train.record_sample_ids)."""
    trainer = _trainer(tmp_path, "train.record_sample_ids=true")
    try:
        used = {type(part) for part in trainer.checkpoints.parts.values()}
    finally:
        trainer.close()
    assert adapters_in_parts_py() - used == set()
