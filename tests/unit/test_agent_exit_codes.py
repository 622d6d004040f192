"""The exit code of a pod whose workers failed: the cause wins over its consequences.

torch's own ChildFailedError/ProcessFailure objects, as the elastic agent raises them.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from kubeddp.trainer import exit_codes
from kubeddp.trainer.launcher.agent import exit_code_of_failure

pytestmark = pytest.mark.timeout(60)


def failed(tmp_path: Path, *exitcodes: int) -> ChildFailedError:
    """Workers 0..n-1 failed with these codes (torch: -N for a death by signal N), in order."""
    failures = {}
    for rank, code in enumerate(exitcodes):
        failure = ProcessFailure(rank, 1000 + rank, code, str(tmp_path / f"missing-{rank}.json"))
        failure.timestamp = 100 + rank  # one second apart: rank order is time order
        failures[rank] = failure
    return ChildFailedError("kubeddp.trainer.worker", failures)


SIGKILLED = -int(signal.SIGKILL)


@pytest.mark.parametrize(
    ("codes", "expected", "why"),
    [
        ((exit_codes.PEER_FAILED,), exit_codes.PEER_FAILED, "another pod failed"),
        ((SIGKILLED,), exit_codes.KILLED, "OOM-killed: 128 + 9, retried"),
        (
            (exit_codes.PEER_FAILED, SIGKILLED),
            exit_codes.PEER_FAILED,
            "a hung local peer the agent SIGKILLed after the timeout: still retried",
        ),
        ((exit_codes.TRAINING_FAILED,), exit_codes.TRAINING_FAILED, "the program's own bug"),
        (
            (exit_codes.PEER_FAILED, exit_codes.TRAINING_FAILED),
            exit_codes.TRAINING_FAILED,
            "a local worker's bug made its local peer's collective fail: not retried forever",
        ),
        (
            (exit_codes.TRAINING_FAILED, exit_codes.PREEMPTED, SIGKILLED),
            exit_codes.TRAINING_FAILED,
            "the others were stopped by the agent (SIGTERM handled: 143; SIGKILL: 137)",
        ),
        (
            (exit_codes.PREEMPTED, exit_codes.PREEMPTED),
            exit_codes.PREEMPTED,
            "a preemption vote: every rank saved and stopped",
        ),
        ((SIGKILLED, exit_codes.PREEMPTED), exit_codes.PREEMPTED, "preempted, then stopped"),
        ((exit_codes.BAD_INPUT, exit_codes.TRAINING_FAILED), exit_codes.BAD_INPUT, "the first"),
        ((-int(signal.SIGSEGV),), 128 + int(signal.SIGSEGV), "a crash by signal is >= 128"),
        (
            (exit_codes.PEER_FAILED, -int(signal.SIGABRT)),
            128 + int(signal.SIGABRT),
            "a local crash is the cause of the local peer's failure",
        ),
    ],
)
def test_pod_exit_code(tmp_path: Path, codes: tuple[int, ...], expected: int, why: str) -> None:
    assert exit_code_of_failure(failed(tmp_path, *codes)) == expected, why


def test_earliest_failure_wins_over_rank_order(tmp_path: Path) -> None:
    exc = failed(tmp_path, exit_codes.BAD_INPUT, exit_codes.TRAINING_FAILED)
    exc.failures[1].timestamp = 50  # rank 1 failed first
    assert exit_code_of_failure(exc) == exit_codes.TRAINING_FAILED


def test_a_programs_own_code_is_not_named_after_a_cli_code() -> None:
    """A user's `sys.exit(3)` is not a "cluster error": that name is the CLI's."""
    assert exit_codes.describe(exit_codes.CLUSTER_ERROR) == "3 (fatal)"
    assert exit_codes.describe(exit_codes.PEER_FAILED) == "201 (peer failed, retryable)"
    assert exit_codes.describe(250) == "250 (retryable)"
