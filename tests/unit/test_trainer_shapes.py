"""What the loop records and the shapes it feeds the model, in one CPU process: the step-times
file (the GPU benchmark's hook) and train.drop_last. torch.compile's shapes:
tests/integration/test_compile_shapes.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from kubeddp.trainer import constants
from kubeddp.trainer.config import load_config
from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.loop import Trainer
from kubeddp.trainer.worker.observer import SampleIdRecorder

pytestmark = pytest.mark.timeout(300)

CPU = DistContext(0, 1, torch.device("cpu"), "gloo")
# 400 samples: 360 training rows, 12 batches of 30 per epoch; 40 eval rows.
REGRESSION = ["workload.name=regression", "workload.samples=400", "metrics.enabled=false"]


def _fit(tmp_path: Path, *overrides: str) -> Trainer:
    cfg = load_config(None, [*REGRESSION, f"checkpoint.dir={tmp_path}", *overrides])
    trainer = Trainer(cfg, CPU)
    try:
        assert trainer.fit() == 0
    finally:
        trainer.close()
    return trainer


def _sample_record(trainer: Trainer) -> dict[int, list[int]]:
    (recorder,) = [o for o in trainer.observers if isinstance(o, SampleIdRecorder)]
    return recorder.record


def test_the_step_times_file_has_the_benchmark_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "summary.json"
    monkeypatch.setenv(constants.ENV_SUMMARY_FILE, str(summary))
    before = time.time()
    _fit(tmp_path, "train.batch_size=32", "train.max_steps=5")
    data = json.loads(summary.read_text())
    assert len(data["step_end_unix"]) == len(data["step_end_cpu"]) == 5
    assert (data["world_size"], data["samples_per_step"], data["tokens_per_sample"]) == (1, 32, 0)
    assert data["max_memory_allocated"] == 0  # CPU
    # This process (pytest) started before the test; its first step ended after `before`.
    assert data["worker_start_unix"] < before < data["train_start_unix"]
    first_end = data["worker_start_unix"] + data["first_step_end_seconds"]
    assert first_end == pytest.approx(data["step_end_unix"][0])
    assert data["train_start_unix"] <= data["step_end_unix"][0]


def test_drop_last_trains_full_batches_only(tmp_path: Path) -> None:
    trainer = _fit(tmp_path / "drop", "train.batch_size=50", "train.epochs=2",
                   "train.drop_last=true", "train.record_sample_ids=true")  # fmt: skip
    # 360 rows: 7 full batches of 50 per epoch; the 10 rows left differ between epochs.
    assert trainer.state.step == 14
    record = _sample_record(trainer)
    assert [len(record[epoch]) for epoch in (0, 1)] == [350, 350]
    assert len(set(record[0])) == 350 and set(record[0]) != set(record[1])
    kept = _fit(tmp_path / "keep", "train.batch_size=50", "train.epochs=2",
                "train.record_sample_ids=true")  # fmt: skip
    assert kept.state.step == 16
    assert sorted(_sample_record(kept)[0]) == list(range(360)), "each sample once"


def test_drop_last_with_no_full_batch_is_refused(tmp_path: Path) -> None:
    cfg = load_config(
        None, [*REGRESSION, f"checkpoint.dir={tmp_path}", "train.batch_size=400",
               "train.drop_last=true"]
    )  # fmt: skip
    with pytest.raises(ValueError, match="train.drop_last=true leaves no full batch") as err:
        Trainer(cfg, CPU)
    assert "\n" not in str(err.value)
