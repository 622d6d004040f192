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
