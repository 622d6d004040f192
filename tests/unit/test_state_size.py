"""kubeddp render's size of a built-in workload's snapshot (trainer/state_size.py) is what a
real snapshot of that workload holds: the model's state_dict and the optimizer's state, counted
from the built models after one real optimizer step (the moments exist only then)."""

from __future__ import annotations

import pytest
import torch

from kubeddp.trainer import state_size
from kubeddp.trainer.config import load_config
from kubeddp.trainer.worker.schedule import build_optimizer
from kubeddp.trainer.worker.snapshot import flatten
from kubeddp.trainer.workloads import build_workload

CASES = [
    ["workload.name=regression"],
    ["workload.name=regression", "workload.input_dim=7", "workload.hidden_dim=33",
     "train.optimizer=sgd"],
    ["workload.name=charlm", "workload.corpus_max_bytes=20000"],
    ["workload.name=charlm", "workload.corpus_max_bytes=20000", "workload.n_layer=3",
     "workload.n_embd=48", "workload.n_head=3", "workload.seq_len=17"],
]  # fmt: skip


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o))
def test_the_size_kubeddp_reserves_is_the_real_snapshot(overrides: list[str]) -> None:
    cfg = load_config(None, overrides)
    model = build_workload(cfg.workload, 0).model
    optimizer = build_optimizer(model.parameters(), cfg.train)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state, params = state_size.model_numel(cfg.workload) or (None, None)
    assert state == sum(t.numel() for t in model.state_dict().values())
    assert params == sum(p.numel() for p in model.parameters())
    _, tensors = flatten.split({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    real = flatten.layout(tensors)[1]
    estimate = state_size.snapshot_bytes(cfg.workload, cfg.train)
    assert estimate is not None and real <= estimate <= real + state_size.OVERHEAD_BYTES + 4096


def test_a_custom_model_has_no_size_of_its_own() -> None:
    cfg = load_config(None, ["workload.name=custom", "workload.model=a:b", "workload.data=a:c"])
    assert state_size.snapshot_bytes(cfg.workload, cfg.train) is None
