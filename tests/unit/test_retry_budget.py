"""The retry budget: restarts of a pod since the checkpoints last advanced, kept beside them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubeddp.trainer import constants, exit_codes, process_contract
from kubeddp.trainer.launcher import retry_budget
from kubeddp.trainer.launcher.retry_budget import RetryBudget, progress_marker

pytestmark = pytest.mark.timeout(30)


def checkpoint(root: Path, step: int, mtime_ns: int) -> None:
    """A checkpoint folder whose newest file has this modification time."""
    folder = root / f"ckpt-{step:08d}"
    folder.mkdir(parents=True)
    state = folder / "state.pt"
    state.write_bytes(b"x")
    os.utime(state, ns=(mtime_ns, mtime_ns))


def failing_start(budget: RetryBudget, code: int = exit_codes.KILLED) -> str | None:
    refusal = budget.start()
    if refusal is None:
        budget.ended(code, f"workers failed: exit code {exit_codes.describe(code)}")
    return refusal


def test_restarts_without_progress_end_with_the_last_failure(tmp_path: Path) -> None:
    budget = RetryBudget(str(tmp_path), limit=2, pod="job-worker-1")
    assert [failing_start(budget) for _ in range(3)] == [None, None, None]  # 1st + 2 restarts
    refusal = budget.start()
    assert refusal is not None
    assert "retries exhausted: 3 restarts of pod job-worker-1" in refusal
    assert "retries.without_progress=2" in refusal
    assert "last failure: workers failed: exit code 137 (killed, retryable)" in refusal
    assert "\n" not in refusal


def test_a_new_checkpoint_restores_the_budget(tmp_path: Path) -> None:
    budget = RetryBudget(str(tmp_path), limit=1, pod="p")
    assert failing_start(budget) is None
    assert failing_start(budget) is None  # restart 1 of 1
    checkpoint(tmp_path, 10, 2_000_000_000_000_000_000)
    assert failing_start(budget) is None  # progress: the count starts again
    assert budget.record.restarts == 0
    assert failing_start(budget) is None
    assert budget.start() is not None


def test_rank_0s_note_of_a_snapshot_in_memory_restores_the_budget(tmp_path: Path) -> None:
    """A job that resumes from a peer's memory after each lost pod advances without a new
    checkpoint: rank 0's note of its newest in-memory snapshot is progress too (it is hidden:
    no checkpoint, and no other hidden file, is progress)."""
    budget = RetryBudget(str(tmp_path), limit=1, pod="p")
    assert failing_start(budget) is None
    assert failing_start(budget) is None  # restart 1 of 1
    process_contract.note_progress(str(tmp_path), 120)
    note = tmp_path / process_contract.PROGRESS_NOTE
    os.utime(note, ns=(2_000_000_000_000_000_000,) * 2)
    assert failing_start(budget) is None
    assert budget.record.restarts == 0
    assert failing_start(budget) is None
    assert budget.start() is not None


def test_a_pod_killed_before_it_could_say_counts(tmp_path: Path) -> None:
    """A node loss or a container OOM kill ends launch too: no exit code is recorded."""
    budget = RetryBudget(str(tmp_path), limit=1, pod="p")
    assert budget.start() is None  # and then the pod is gone, nothing recorded
    assert RetryBudget(str(tmp_path), limit=1, pod="p").start() is None
    refusal = RetryBudget(str(tmp_path), limit=1, pod="p").start()
    assert refusal is not None and "the pod was killed" in refusal


@pytest.mark.parametrize("code", [exit_codes.OK, exit_codes.INTERRUPTED, exit_codes.BAD_INPUT])
def test_ends_that_are_not_retries_reset_the_count(tmp_path: Path, code: int) -> None:
    budget = RetryBudget(str(tmp_path), limit=1, pod="p")
    for _ in range(3):
        assert failing_start(budget, code) is None


def test_a_spent_budget_does_not_refuse_the_next_submission(tmp_path: Path) -> None:
    budget = RetryBudget(str(tmp_path), limit=0 + 1, pod="p")
    while failing_start(budget) is None:
        pass
    assert budget.start() is None, "exit 5 is fatal: the job was resubmitted, a fresh count"


def test_the_record_is_hidden_and_is_not_progress(tmp_path: Path) -> None:
    checkpoint(tmp_path, 5, 1_000_000_000_000_000_000)
    before = progress_marker(tmp_path)
    budget = RetryBudget(str(tmp_path), limit=3, pod="p")
    failing_start(budget)
    assert budget.path.parent.name.startswith(".")
    assert progress_marker(tmp_path) == before
    (tmp_path / ".tmp-ckpt-00000006").mkdir()
    (tmp_path / ".tmp-ckpt-00000006" / "state.pt").write_bytes(b"half")
    assert progress_marker(tmp_path) == before, "a half-written checkpoint is no progress"


def test_off_when_zero_or_object_storage_or_unwritable(tmp_path: Path) -> None:
    assert not RetryBudget(str(tmp_path), limit=0).enabled
    assert not RetryBudget("s3://bucket/prefix", limit=3).enabled
    blocker = tmp_path / "file"
    blocker.write_text("")
    budget = RetryBudget(str(blocker / "sub"), limit=3, pod="p")
    assert budget.start() is None and not budget.enabled


def test_termination_message_only_where_the_kubelet_made_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setenv(constants.ENV_TERMINATION_LOG, str(log))
    retry_budget.write_termination_message("not written: no such file")
    assert not log.exists()
    log.write_text("")
    retry_budget.write_termination_message("retries exhausted: " + "x" * 5000)
    text = log.read_text()
    assert text.startswith("retries exhausted: ")
    assert len(text.encode()) == retry_budget.MAX_MESSAGE_BYTES


UNREADABLE = {
    "a string count": '{"progress_ns": 0, "restarts": "3", "last_exit": null}',
    "a bool exit": '{"progress_ns": 0, "restarts": 1, "last_exit": true}',
    "a float marker": '{"progress_ns": 1.5, "restarts": 1, "last_exit": 137}',
    "a negative count": '{"progress_ns": 0, "restarts": -1, "last_exit": 137}',
    "a list": "[1, 2]",
    "not JSON": "{",
    "not UTF-8": b"\xff\xfe{}",
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_an_unreadable_record_is_ignored_with_a_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every start ended with an internal error (4) on a wrongly typed field; now the count
    starts afresh and says why."""
    budget = RetryBudget(str(tmp_path), limit=1, pod="p")
    budget.path.parent.mkdir(parents=True)
    text = UNREADABLE[case]
    budget.path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert budget.start() is None
    assert budget.record.restarts == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"retry record {budget.path} is unreadable (" in lines[0], lines
    budget.ended(exit_codes.KILLED, "killed")  # the record written now is a good one again
    again = RetryBudget(str(tmp_path), limit=1, pod="p")
    assert again.start() is None and again.record.restarts == 1
    assert capsys.readouterr().err == ""
