"""The Trainer's checkpoint contract in one process (no process group): what a checkpoint holds,
which one `checkpoint.resume` picks, and the refusals. Multi-process behaviour (kills,
SIGTERM, restarts, nodes) is in tests/integration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kubeddp.trainer.config import load_config
from kubeddp.trainer.worker import checkpoint as ckpt
from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.loop import Trainer
from kubeddp.trainer.worker.schedule import lr_factor
from tests.helpers import checkpoints as ck

pytestmark = pytest.mark.timeout(120)

CPU = DistContext(0, 1, torch.device("cpu"), "gloo")


def _trainer(ckpt_dir: Path, *overrides: str) -> Trainer:
    cfg = load_config(
        None,
        [
            "workload.name=regression",
            "workload.samples=400",
            "train.batch_size=30",
            "train.max_steps=8",
            "train.log_every=100",
            "train.record_sample_ids=true",
            f"checkpoint.dir={ckpt_dir}",
            "checkpoint.every_steps=4",
            "checkpoint.async_save=false",
            "metrics.enabled=false",
            *overrides,
        ],
    )
    return Trainer(cfg, CPU)


def _fit(trainer: Trainer) -> int:
    try:
        return trainer.fit()
    finally:
        trainer.close()


def test_a_checkpoint_holds_the_full_training_state(tmp_path: Path) -> None:
    assert _fit(_trainer(tmp_path)) == 0
    assert [r.step for r in ckpt.list_checkpoints(tmp_path)] == [8, 4]
    state = ckpt.load_state(ckpt.list_checkpoints(tmp_path)[0])
    for key in ("model", "optimizer", "scheduler", "scaler", "rng", "config", "config_hash"):
        assert key in state, key
    assert (state["step"], state["epoch"], state["world_size"]) == (8, 0, 1)
    assert state["consumed"] == 8 * 30
    assert state["model_hash"] and "workload:" in state["config"]
    assert state["optimizer"]["state"], "AdamW moments must be saved"
    assert len(state["sample_record"][0][0]) == 8 * 30


def test_resume_auto_continues_from_the_newest(tmp_path: Path) -> None:
    _fit(_trainer(tmp_path))
    again = _trainer(tmp_path, "train.max_steps=12")
    resumed = again.checkpoints.resume()
    assert resumed is not None and (resumed.step, resumed.consumed) == (8, 240)
    assert again.optimizer.state_dict()["state"], "optimizer moments restored"
    again.close()


def test_resume_may_name_one_checkpoint(tmp_path: Path) -> None:
    _fit(_trainer(tmp_path / "run"))
    older = tmp_path / "run" / "ckpt-00000004"
    trainer = _trainer(tmp_path / "new", f"checkpoint.resume={older}")
    resumed = trainer.checkpoints.resume()
    assert resumed is not None and resumed.step == 4
    trainer.close()


def test_resume_path_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    trainer = _trainer(tmp_path / "new", f"checkpoint.resume={empty}")
    with pytest.raises(ckpt.CheckpointError, match="holds no readable checkpoint"):
        trainer.checkpoints.resume()
    trainer.close()


def test_another_model_is_refused_unless_weights_only(tmp_path: Path) -> None:
    _fit(_trainer(tmp_path))
    other = _trainer(tmp_path, "workload.hidden_dim=32")
    with pytest.raises(ckpt.CheckpointError, match="written for another model") as err:
        other.checkpoints.resume()
    assert "\n" not in str(err.value) and "checkpoint.weights_only=true" in str(err.value)
    other.close()
    # Same shapes except the input layer: the three tensors that fit are loaded.
    partial = _trainer(tmp_path, "workload.input_dim=10", "checkpoint.weights_only=true")
    assert partial.checkpoints.resume() is None, "weights only: step and optimizer start fresh"
    saved = ckpt.load_state(ckpt.list_checkpoints(tmp_path)[0])["model"]
    assert torch.equal(partial.raw_model.state_dict()["2.weight"], saved["2.weight"])
    partial.close()


def test_fit_after_a_resume_plans_the_steps_left(tmp_path: Path, capsys) -> None:
    _fit(_trainer(tmp_path))
    capsys.readouterr()
    again = _trainer(tmp_path, "train.max_steps=12", "train.log_every=2")
    try:
        assert again.fit() == 0
        assert (again.state.step, again.total_steps) == (12, 12)
        # The LR schedule spans the re-planned run (12 steps), not the first run's 8.
        t = again.cfg.train
        span_12, span_8 = (lr_factor(11, n, t.warmup_steps, t.min_lr_ratio) for n in (12, 8))
        assert span_12 != span_8
        assert again.scheduler.lr_lambdas[0](11) == pytest.approx(span_12)
    finally:
        again.close()
    out = capsys.readouterr().out
    assert "| 12 steps" in out and "step 10/12 |" in out and "done: 12 steps" in out, out
    assert [r.step for r in ckpt.list_checkpoints(tmp_path)] == [12, 8, 4]


def test_another_seed_is_refused_in_one_line(tmp_path: Path) -> None:
    _fit(_trainer(tmp_path))
    other = _trainer(tmp_path, "train.seed=99")
    with pytest.raises(ckpt.CheckpointError, match="written with train.seed=1234") as err:
        other.checkpoints.resume()
    assert "\n" not in str(err.value) and "set train.seed=1234 to resume" in str(err.value)
    other.close()


def test_the_seed_of_an_older_checkpoint_comes_from_its_config_copy(tmp_path: Path) -> None:
    _fit(_trainer(tmp_path))
    newest = ckpt.list_checkpoints(tmp_path)[0]
    state = ckpt.load_state(newest)
    del state["seed"]  # written before checkpoints recorded it
    ck.replace_state(newest.path, state)  # with its marker: it passes its digests
    other = _trainer(tmp_path, "train.seed=7")
    with pytest.raises(ckpt.CheckpointError, match="train.seed=1234"):
        other.checkpoints.resume()
    other.close()


def test_tensors_of_another_shape_fall_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    _fit(_trainer(tmp_path))
    newest = ckpt.list_checkpoints(tmp_path)[0]
    state = ckpt.load_state(newest)
    state["model"]["0.weight"] = torch.zeros(3, 3)  # same model hash, wrong tensor
    ck.replace_state(newest.path, state)  # with its marker: it passes its digests
    messages: list[str] = []
    again = _trainer(tmp_path)
    again.checkpoints.log = messages.append
    resumed = again.checkpoints.resume()
    again.close()
    assert resumed is not None and resumed.step == 4
    assert any("holds the wrong content (its tensor 0.weight has shape" in m for m in messages)
    assert (tmp_path / f"{newest.path.name}.bad").is_dir(), "set aside, kept"


def test_one_writer_per_directory_in_one_process_too(tmp_path: Path) -> None:
    first = _trainer(tmp_path)
    first.checkpoints.resume()
    second = _trainer(tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="is in use by another run"):
        second.checkpoints.resume()
    second.close()
    first.close()
    third = _trainer(tmp_path)
    third.checkpoints.resume()  # free again once the first closed
    third.close()


def test_checkpoints_that_are_all_unusable_are_never_trained_over_from_step_0(
    tmp_path: Path,
) -> None:
    """Every checkpoint there fails (here: cut short, as a lying store leaves one): each is
    set aside as .bad and said, and the run refuses in one line instead of starting over from
    step 0 beside them."""
    _fit(_trainer(tmp_path))
    refs = ckpt.list_checkpoints(tmp_path)
    for ref in refs:
        state_file = Path(ref.path) / ckpt.STATE_FILE
        state_file.write_bytes(state_file.read_bytes()[:100])
    messages: list[str] = []
    again = _trainer(tmp_path)
    again.checkpoints.log = messages.append
    with pytest.raises(ckpt.CheckpointError, match="none could be used") as refused:
        again.checkpoints.resume()
    again.close()
    assert "checkpoint.resume=never to start afresh" in str(refused.value)
    assert sum("holds 100 bytes" in m for m in messages) == len(refs), messages
    assert all((tmp_path / f"{Path(r.path).name}.bad").is_dir() for r in refs), "all kept"
