"""Snapshot states for the in-memory snapshot tests: a state with every kind of tensor and plain
value, an exact comparison, and one snapshot taken by a writer of its own."""

from __future__ import annotations

from pathlib import Path

import torch

from kubeddp.trainer.worker.snapshot.taker import SnapshotTaker


def state(step: int) -> dict:
    torch.manual_seed(step)
    return {
        "model": {"w": torch.randn(4, 3), "b": torch.zeros(3, dtype=torch.bfloat16)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(float(step)), "m": torch.randn(4, 3)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },  # fmt: skip
        "empty": torch.empty(0, 5),
        "flags": torch.tensor([True, False]),
        "rng": [(3, tuple(range(5)), None)],
        "step": step,
        "nested": ({"a": [1, torch.arange(3)]},),
    }


def equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(equal, a, b))
    return a == b


def take(root: Path, step: int, logs: list[str], taker: SnapshotTaker | None = None) -> None:
    """One snapshot of state(step) by `taker`, or by a writer of its own (closed after: it
    holds the directory's lock while it lives, as a run's writer does)."""
    own = taker or SnapshotTaker(root, writer=True, every_steps=1, device=torch.device("cpu"),
                                 log=logs.append, run={"seed": 1})  # fmt: skip
    own.take(step, lambda: state(step), {}, [])
    own.wait()
    if taker is None:
        own.close()
