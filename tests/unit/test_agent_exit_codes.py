"""The exit code of a pod whose workers failed: the cause wins over its consequences.

torch's own ChildFailedError/ProcessFailure objects, as the elastic agent raises them.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from kubeddp.trainer import exit_codes
from kubeddp.trainer.launcher.agent import (
    AGENT_SIGKILL_AFTER_SECONDS,
    exit_code_of_failure,
    first_failed,
)

pytestmark = pytest.mark.timeout(60)


def failed(tmp_path: Path, *exitcodes: int, late: tuple[int, ...] = ()) -> ChildFailedError:
    """Workers 0..n-1 failed with these codes (torch: -N for a death by signal N), in order, one
    second apart; the ranks in `late` the agent's shutdown timeout later (what it SIGKILLed)."""
    failures = {}
    for rank, code in enumerate(exitcodes):
        failure = ProcessFailure(rank, 1000 + rank, code, str(tmp_path / f"missing-{rank}.json"))
        failure.timestamp = 100 + rank + (AGENT_SIGKILL_AFTER_SECONDS if rank in late else 0)
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
            exit_codes.KILLED,
            "a worker the kernel SIGKILLed (OOM) and a local peer that saw it: the pod's own "
            "137, never a peer failure",
        ),
        (
            (SIGKILLED, exit_codes.PEER_FAILED),
            exit_codes.KILLED,
            "OOM first, then the peer's collective failed",
        ),
        (
            (SIGKILLED, exit_codes.PREEMPTED),
            exit_codes.KILLED,
            "OOM, then the agent stopped the local peer with SIGTERM: not a preemption",
        ),
        (
            (-int(signal.SIGSEGV), exit_codes.PEER_FAILED),
            exit_codes.CRASHED,
            "a segfault wins over the peer that saw it",
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
        ((exit_codes.BAD_INPUT, exit_codes.TRAINING_FAILED), exit_codes.BAD_INPUT, "the first"),
        ((-int(signal.SIGSEGV),), exit_codes.CRASHED, "a crash by signal: crashed, retried"),
        ((-int(signal.SIGHUP),), exit_codes.CRASHED, "a signal no row names: crashed"),
        ((134,), exit_codes.CRASHED, "a code >= 128 no row names: crashed"),
        (
            (exit_codes.PEER_FAILED, -int(signal.SIGABRT)),
            exit_codes.CRASHED,
            "a local crash is the cause of the local peer's failure",
        ),
    ],
)
def test_pod_exit_code(tmp_path: Path, codes: tuple[int, ...], expected: int, why: str) -> None:
    assert exit_code_of_failure(failed(tmp_path, *codes)) == expected, why


@pytest.mark.parametrize(
    ("codes", "late", "expected", "why"),
    [
        (
            (exit_codes.PEER_FAILED, SIGKILLED),
            (1,),
            exit_codes.PEER_FAILED,
            "a hung local peer the agent SIGKILLed after the shutdown timeout: still retried",
        ),
        (
            (exit_codes.PREEMPTED, SIGKILLED),
            (1,),
            exit_codes.PREEMPTED,
            "preempted; a worker too slow to save was SIGKILLed at the end of the timeout",
        ),
        (
            (exit_codes.TRAINING_FAILED, SIGKILLED),
            (1,),
            exit_codes.TRAINING_FAILED,
            "the program's own failure; the agent killed the rest",
        ),
    ],
)
def test_the_agents_late_sigkill_is_a_consequence(
    tmp_path: Path, codes: tuple[int, ...], late: tuple[int, ...], expected: int, why: str
) -> None:
    assert exit_code_of_failure(failed(tmp_path, *codes, late=late)) == expected, why


def test_earliest_failure_wins_over_rank_order(tmp_path: Path) -> None:
    exc = failed(tmp_path, exit_codes.BAD_INPUT, exit_codes.TRAINING_FAILED)
    exc.failures[1].timestamp = 50  # rank 1 failed first
    assert exit_code_of_failure(exc) == exit_codes.TRAINING_FAILED


def test_a_programs_own_code_is_not_named_after_a_cli_code() -> None:
    """A user's `sys.exit(3)` is not a "cluster error": that name is the CLI's."""
    assert exit_codes.describe(exit_codes.CLUSTER_ERROR) == "3 (fatal)"
    assert exit_codes.describe(exit_codes.PEER_FAILED) == "201 (peer failed, retryable)"
    assert exit_codes.describe(250) == "250 (retryable)"


def test_the_line_names_the_rank_whose_code_the_pod_ends_with(tmp_path: Path) -> None:
    """A rank aborts (SIGABRT) and its peer's collective fails a moment before the abort is
    reported: the pod ends crashed, and the line names the rank that died by the signal."""
    exc = failed(tmp_path, exit_codes.PEER_FAILED, -int(signal.SIGABRT))
    exc.failures[1].timestamp = exc.failures[0].timestamp + 1
    code = exit_code_of_failure(exc)
    assert code == exit_codes.CRASHED
    assert first_failed(exc, code).startswith("; local rank 1")
    assert first_failed(exc, code).endswith("failed first (died by SIGABRT)")


@pytest.mark.parametrize(
    ("codes", "stop_after", "expected", "why"),
    [
        (
            (exit_codes.PREEMPTED,),
            0,
            exit_codes.PEER_FAILED,
            "the round watch's SIGTERM, handled: the pod rejoins, it was not preempted",
        ),
        (
            (SIGKILLED,),
            0,
            exit_codes.PEER_FAILED,
            "stuck in native code, SIGKILLed by the watch: not an OOM kill",
        ),
        (
            (-int(signal.SIGTERM), exit_codes.PEER_FAILED),
            0,
            exit_codes.PEER_FAILED,
            "one stopped, its local peer's collective failed after it",
        ),
        (
            (exit_codes.TRAINING_FAILED, exit_codes.PREEMPTED),
            1,
            exit_codes.TRAINING_FAILED,
            "the program failed a second before the watch stopped the rest: its own code",
        ),
    ],
)
def test_workers_the_round_watch_stopped_are_a_consequence(
    tmp_path: Path, codes: tuple[int, ...], stop_after: int, expected: int, why: str
) -> None:
    """`stopped_at`: when round_watch.py stopped the workers (worker 0 fails at 100)."""
    exc = failed(tmp_path, *codes)
    assert exit_code_of_failure(exc, stopped_at=100.5 + stop_after) == expected, why
