"""The training loop does not make the host wait for the device on every step.

On a GPU, reading a tensor's value (`.item()`, `.tolist()`, `.cpu()`, `float(t)`, `if t:`) or
`torch.cuda.synchronize()` blocks the host until the device has caught up, and the GPU then
idles while the host prepares the next step. CI has no GPU, so this counts those calls made
by kubeddp's own code (directly, or through torch functions it calls) during a real CPU
training run with a real one-rank gloo group (so the stop vote and the rank averages run),
and checks they happen only at the start (the DataLoader draws its seed), at log steps, at
epoch ends (evaluation, checkpoint, the next epoch's permutation and DataLoader seed) and at
the end of the run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import kubeddp.trainer
from kubeddp.trainer.config import load_config
from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.loop import Trainer
from tests.helpers.one_rank import DEVICE_TYPES, one_rank_group

pytestmark = pytest.mark.timeout(180)

TRAINER_DIR = str(Path(kubeddp.trainer.__file__).parent)
TORCH_DIR = str(Path(torch.__file__).parent)
READS = ("item", "tolist", "cpu", "__bool__", "__float__", "__int__", "__index__")


def _caller() -> tuple[str, str] | None:
    """(file, function) of the first frame outside torch, if it is kubeddp trainer code."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(TRAINER_DIR):
        return None
    return frame.f_code.co_filename, frame.f_code.co_name


def _count_reads(
    monkeypatch: pytest.MonkeyPatch, step_of: Callable[[], int]
) -> list[tuple[int, str]]:
    """(step, "function:read") of every read made from kubeddp code while the test runs."""
    reads: list[tuple[int, str]] = []

    def counting(name: str, original: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            caller = _caller()
            if caller is not None:
                reads.append((step_of(), f"{caller[1]}:{name}"))
            return original(*args, **kwargs)

        wrapper.__name__ = name
        return wrapper

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", counting("synchronize", torch.cuda.synchronize))
    return reads


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_reads_happen_only_at_log_steps_epoch_ends_and_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device_type: str
) -> None:
    with one_rank_group(device_type) as ctx:
        _check_a_run(tmp_path, monkeypatch, ctx)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_diagnostics_add_no_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device_type: str
) -> None:
    """The heartbeat, the collective counts and the divergence guard, all on (as under
    kubeddp launch): still no read outside the allowed steps."""
    import tempfile

    from kubeddp.trainer import process_contract
    from kubeddp.trainer.worker import heartbeat

    with tempfile.TemporaryDirectory(prefix="kubeddp-diag-test-") as diag:
        monkeypatch.setenv(process_contract.ENV_DIAG_DIR, diag)
        monkeypatch.setattr(heartbeat, "_THIS", None)
        with one_rank_group(device_type) as ctx:
            _check_a_run(tmp_path, monkeypatch, ctx)
        record = process_contract.read_record(process_contract.record_path(diag, 0))
        assert record.step == 18


def _check_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctx: DistContext) -> None:
    cfg = load_config(
        None,
        [
            "workload.name=regression",
            "workload.samples=400",  # 360 training rows: 12 micro-batches of 32, the last short
            "train.batch_size=32",
            "train.grad_accum_steps=2",  # no_sync and a loss summed over micro-steps
            "train.epochs=3",
            "train.log_every=4",
            "train.grad_clip=1.0",
            f"checkpoint.dir={tmp_path}",
            "checkpoint.async_save=false",
            # In-memory snapshots gather the ranks' RNG streams (on a gloo group of their own
            # under NCCL, so the host never waits for the GPU there): at epoch ends here.
            "checkpoint.memory_every_steps=6",
            "metrics.enabled=false",
        ],
    )
    trainer = Trainer(cfg, ctx)
    assert trainer.stop_vote.distributed, "the vote must run through the process group"
    reads = _count_reads(monkeypatch, lambda: trainer.state.step)
    try:
        assert trainer.fit() == 0
    finally:
        monkeypatch.undo()
        trainer.close()
    per_epoch = 6  # 12 micro-batches, 2 per step
    total = 3 * per_epoch
    allowed = {0, total} | {s for s in range(total) if s % 4 == 0 or s % per_epoch == 0}
    assert not [(step, fn) for step, fn in reads if step not in allowed], reads
    loss_reads = {step for step, fn in reads if fn == "mean_over_ranks:item"}
    assert loss_reads == {4, 8, 12, 16, 18}, reads  # the log steps, and the done line's


def test_evaluation_reads_once_not_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads_by_batches = {}
    for batches in (2, 8):
        cfg = load_config(
            None,
            [
                "workload.name=regression",
                "workload.samples=4000",  # 400 eval rows: more than 8 batches of 16
                "train.batch_size=16",
                f"train.eval_batches={batches}",
                f"checkpoint.dir={tmp_path}",
                "metrics.enabled=false",
            ],
        )
        trainer = Trainer(cfg, DistContext(0, 1, torch.device("cpu"), "gloo"))
        reads = _count_reads(monkeypatch, lambda: 0)
        try:
            val = trainer.evaluator.evaluate(step=0)
        finally:
            monkeypatch.undo()
            trainer.close()
        assert val is not None and val > 0
        reads_by_batches[batches] = [fn for _, fn in reads]
    # The DataLoader's seed, then the one read of the sums: none per batch.
    assert reads_by_batches[2] == reads_by_batches[8] == ["evaluate:item", "evaluate:tolist"]
