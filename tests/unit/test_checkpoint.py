"""trainer/worker/checkpoint/ (local.py, state.py, writer.py) on a real filesystem: atomic
layout, keep-N, skipping unreadable checkpoints, weights_only loading, the background writer
and its errors."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from kubeddp.trainer.worker import checkpoint as ckpt
from tests.helpers import checkpoints as ck

pytestmark = pytest.mark.timeout(60)


def _state(step: int) -> dict:
    """What a checkpoint holds (every key load_newest_valid requires), small."""
    return {
        "step": step,
        "epoch": 0,
        "consumed": 0,
        "model": {"w": torch.full((3,), float(step))},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {},
        "scaler": {},
    }


def _write(root: Path, step: int, keep: int = 10) -> Path:
    return ckpt.write_checkpoint(root, step, _state(step), "config: {}\n", keep)


def test_layout_is_a_complete_directory_per_step(tmp_path: Path) -> None:
    path = _write(tmp_path, 7)
    assert path == tmp_path / "ckpt-00000007"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "config.yaml", "state.pt"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-00000007"], "no temporary left"
    assert ckpt.load_state(ckpt.list_checkpoints(tmp_path)[0])["step"] == 7


def test_only_the_newest_keep_checkpoints_remain(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        _write(tmp_path, step, keep=2)
    assert [r.step for r in ckpt.list_checkpoints(tmp_path)] == [20, 15]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000015", "ckpt-00000020"]


def test_directories_without_the_marker_are_not_checkpoints(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    half_done = _write(tmp_path, 10)
    (half_done / ckpt.MARKER).unlink()  # as if killed before the marker was written
    (tmp_path / ".tmp-ckpt-00000015-123").mkdir()  # a writer killed mid-way
    (tmp_path / "ckpt-notanumber").mkdir()
    assert [r.step for r in ckpt.list_checkpoints(tmp_path)] == [5]
    assert ckpt.list_checkpoints(tmp_path / "missing") == []


def test_a_killed_writer_s_temporary_is_removed_by_the_next_save(tmp_path: Path) -> None:
    stale = tmp_path / ".tmp-ckpt-00000010-4242"
    stale.mkdir(parents=True)
    (stale / ckpt.STATE_FILE).write_bytes(b"half")
    _write(tmp_path, 15)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000015"]


def test_a_path_naming_one_checkpoint_lists_just_it(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    one = _write(tmp_path, 10)
    assert [r.step for r in ckpt.list_checkpoints(one)] == [10]
    assert ckpt.list_checkpoints(tmp_path / "ckpt-00000099") == []


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    ckpt.write_checkpoint(tmp_path, 5, {"step": 5, "again": True}, "", keep=3)
    assert ckpt.load_state(ckpt.list_checkpoints(tmp_path)[0])["again"] is True


def test_truncated_newest_is_reported_and_the_previous_loaded(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    newest = _write(tmp_path, 10)
    data = (newest / ckpt.STATE_FILE).read_bytes()
    (newest / ckpt.STATE_FILE).write_bytes(data[: len(data) // 2])
    messages: list[str] = []
    found = ckpt.load_newest_valid(tmp_path, log=messages.append)
    assert found is not None and found[0].step == 5 and found[1]["step"] == 5
    assert len(messages) == 1 and f"checkpoint {newest} is unreadable" in messages[0]
    assert "\n" not in messages[0]
    assert newest.exists(), "a bad checkpoint is kept for inspection, never deleted"


def test_no_readable_checkpoint_means_none(tmp_path: Path) -> None:
    newest = _write(tmp_path, 5)
    (newest / ckpt.STATE_FILE).write_bytes(b"")
    assert ckpt.load_newest_valid(tmp_path, log=lambda _msg: None) is None


class _RunsCode:
    """Unpickling this would call os.mkdir: what a malicious checkpoint could do."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def test_loading_never_runs_code_from_the_file(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpts"
    good = _write(ckpt_dir, 5)
    evil = _write(ckpt_dir, 10)
    marker = tmp_path / "code-ran"
    # recorded in its marker: the digests pass, and torch.load itself must refuse the code
    ck.replace_state(evil, {"step": 10, "payload": _RunsCode(str(marker))})
    messages: list[str] = []
    found = ckpt.load_newest_valid(ckpt_dir, log=messages.append)
    assert not marker.exists(), "torch.load ran code from a checkpoint"
    assert found is not None and found[0].path == good
    assert f"checkpoint {evil} is unreadable" in messages[0]


def test_write_error_names_the_checkpoint_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint directory should be")
    with pytest.raises(ckpt.CheckpointError) as err:
        _write(blocker, 5)
    assert str(blocker / "ckpt-00000005") in str(err.value)
    assert "checkpoint.dir" in str(err.value)


def test_to_cpu_copies_so_training_can_go_on_while_the_copy_is_written() -> None:
    live = {"model": {"w": torch.zeros(3)}, "steps": [torch.ones(1)], "n": 3}
    copy = ckpt.to_cpu(live)
    live["model"]["w"].add_(1)
    live["steps"][0].add_(1)
    assert torch.equal(copy["model"]["w"], torch.zeros(3))
    assert torch.equal(copy["steps"][0], torch.ones(1)) and copy["n"] == 3


def test_to_cpu_reuses_the_memory_of_an_earlier_copy() -> None:
    live = {"w": torch.zeros(4), "b": torch.zeros(2), "groups": [{"lr": 0.1}]}
    first = ckpt.to_cpu(live)
    live["w"].add_(1)
    live["b"] = torch.zeros(3)  # another shape: a new tensor
    second = ckpt.to_cpu(live, reuse=first)
    assert second["w"] is first["w"] and torch.equal(second["w"], torch.ones(4))
    assert second["b"] is not first["b"] and second["b"].shape == (3,)
    assert second["groups"] == [{"lr": 0.1}]


def test_snapshot_waits_for_the_write_that_still_uses_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ckpt.AsyncCheckpointWriter(tmp_path, keep=5, config_yaml="")
    gate = threading.Event()
    real_write = ckpt.write_checkpoint

    def slow_write(directory, step, state, config_yaml, keep):
        gate.wait(10)
        return real_write(directory, step, state, config_yaml, keep)

    monkeypatch.setattr(ckpt.writer, "write_checkpoint", slow_write)
    live = {"w": torch.zeros(3)}
    writer.save(1, writer.snapshot(live), blocking=False)
    live["w"].add_(5)
    threading.Timer(0.2, gate.set).start()
    writer.snapshot(live)  # may only overwrite the buffers once step 1 is on disk
    writer.wait()
    saved = ckpt.load_state(ckpt.list_checkpoints(tmp_path)[0])
    assert torch.equal(saved["w"], torch.zeros(3)), "step 1 was written with step 2's values"


def test_async_writer_writes_in_the_background_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ckpt.AsyncCheckpointWriter(tmp_path, keep=5, config_yaml="")
    gate = threading.Event()
    real_write = ckpt.write_checkpoint
    order: list[int] = []

    def slow_write(directory, step, state, config_yaml, keep):
        gate.wait(10)
        order.append(step)
        return real_write(directory, step, state, config_yaml, keep)

    monkeypatch.setattr(ckpt.writer, "write_checkpoint", slow_write)  # a disk that waits for `gate`
    writer.save(5, _state(5), blocking=False)
    assert writer.busy, "save(blocking=False) must return before the write ends"
    assert ckpt.list_checkpoints(tmp_path) == []
    gate.set()
    writer.save(10, _state(10), blocking=False)  # waits for step 5 first
    writer.wait()
    assert order == [5, 10]
    assert [r.step for r in ckpt.list_checkpoints(tmp_path)] == [10, 5]
    assert writer.last_path == tmp_path / "ckpt-00000010" and not writer.busy


def test_async_writer_reports_a_failed_background_save_on_wait(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = ckpt.AsyncCheckpointWriter(blocker, keep=2, config_yaml="")
    writer.save(5, _state(5), blocking=False)
    with pytest.raises(ckpt.CheckpointError, match="ckpt-00000005"):
        writer.wait()
    writer.wait()  # the error is reported once


def test_any_save_error_is_a_checkpoint_error_and_leaves_no_temporary(tmp_path: Path) -> None:
    # torch's zip writer reports a full disk as RuntimeError; an unpicklable value fails with a
    # pickling error: neither is an OSError, both are a failed save like any other.
    state = {**_state(5), "bad": lambda: None}
    with pytest.raises(ckpt.CheckpointError, match="cannot write checkpoint .*ckpt-00000005"):
        ckpt.write_checkpoint(tmp_path, 5, state, "", keep=3)
    assert list(tmp_path.iterdir()) == [], "the failed save's temporary must go at once"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (torch.zeros(3), "holds a Tensor"),
        ({"step": 5}, "has no model"),
        ({**_state(5), "model": [torch.zeros(1)]}, "its model is a list"),
        ({**_state(5), "step": -1}, "its step is -1"),
        ({**_state(5), "step": True}, "its step is a bool"),
        ({**_state(5), "model": {"w": 1.0}}, "not tensors"),
    ],
    ids=["tensor", "no-model", "model-list", "negative-step", "bool-step", "model-floats"],
)
def test_wrong_content_falls_back_to_the_previous_and_is_kept(
    tmp_path: Path, content: object, problem: str
) -> None:
    _write(tmp_path, 5)
    newest = _write(tmp_path, 10)
    ck.replace_state(newest, content)  # its marker records it: it passes its digests
    messages: list[str] = []
    bad: list[ckpt.CheckpointRef] = []
    found = ckpt.load_newest_valid(tmp_path, log=messages.append, on_bad=bad.append)
    assert found is not None and found[0].step == 5
    assert messages == [messages[0]] and "holds the wrong content" in messages[0], messages
    assert problem in messages[0]
    assert [ref.path for ref in bad] == [newest] and newest.exists()


def test_a_check_of_the_caller_rejects_too(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    _write(tmp_path, 10)
    messages: list[str] = []
    found = ckpt.load_newest_valid(
        tmp_path, log=messages.append, check=lambda s: "too new" if s["step"] > 5 else None
    )
    assert found is not None and found[0].step == 5 and "(too new)" in messages[0]


def test_set_aside_keeps_a_bad_checkpoint_out_of_the_listing(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    first = ckpt.set_aside(ckpt.list_checkpoints(tmp_path)[0])
    _write(tmp_path, 5)
    second = ckpt.set_aside(ckpt.list_checkpoints(tmp_path)[0])
    assert first == tmp_path / "ckpt-00000005.bad" and second == tmp_path / "ckpt-00000005.bad-1"
    assert ckpt.list_checkpoints(tmp_path) == []
    _write(tmp_path, 6, keep=1)  # pruning and the stale sweep leave them alone
    assert first.exists() and second.exists()
