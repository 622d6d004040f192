"""train.compile on CPU (inductor with the system C++ compiler), one process: no recompile at
epoch ends (short last batches run eagerly) or around evaluation (eager, on the unwrapped
model), and no graph break. A recompile there cost the GPU run of issue 15 a factor of 6."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kubeddp.trainer.config import load_config
from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.loop import Trainer

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (shutil.which("c++") or shutil.which("g++")),
        reason="inductor on CPU needs a C++ compiler",
    ),
]

CPU = DistContext(0, 1, torch.device("cpu"), "gloo")


@pytest.mark.slow
def test_compile_does_not_recompile_at_epoch_ends_or_around_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two epochs, each ending in a short batch, evaluation every 5 steps and at each epoch's
    end: one compile of the forward (and its backward), never another."""
    dynamo = pytest.importorskip("torch._dynamo")
    dynamo.reset()
    monkeypatch.setattr(dynamo.config, "error_on_recompile", True)
    counters = dynamo.utils.counters
    counters.clear()
    cfg = load_config(
        None,
        [
            "workload.name=regression",
            "workload.samples=400",  # 360 training rows: 12 batches of 32, the last of 8
            "train.compile=on",
            "train.batch_size=32",
            "train.epochs=2",
            "train.eval_every=5",
            "train.log_every=5",
            f"checkpoint.dir={tmp_path}",
            "metrics.enabled=false",
        ],
    )
    trainer = Trainer(cfg, CPU)
    try:
        assert trainer.fit() == 0
    finally:
        trainer.close()
    assert trainer.state.step == 24
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    dynamo.reset()
