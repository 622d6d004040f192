"""Which exit code a failed training process ends with: a peer's failure is retryable, the
program's own is fatal."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from kubeddp.trainer import exit_codes
from kubeddp.trainer.worker.failures import exit_code_for, is_peer_failure, one_line
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(60)

# What gloo raised in a surviving rank (torch 2.13, 2 processes) when its peer was SIGKILLed,
# and when its peer stopped participating past the group's timeout.
GLOO_PEER_KILLED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:32136: Connection reset by peer. This is typically caused by a remote worker "
    "hanging or bugs in the application."
)
GLOO_PEER_HUNG = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
    "waiting 5000ms for recv operation to complete"
)
# What the DDP all-reduce hook's callback raised in the surviving rank when the timeout had
# closed the pair under another operation first (tests/integration/test_hung_peer.py, torch 2.13).
GLOO_PAIR_CLOSED = (
    "Got the following error when running the callback: RuntimeError: Application timeout "
    "caused pair closure"
)


def test_a_store_that_is_gone_is_a_peer_failure() -> None:
    with pytest.raises(dist.DistError) as caught:
        dist.TCPStore(
            "127.0.0.1",
            free_port(),
            is_master=False,
            timeout=datetime.timedelta(seconds=1),
            wait_for_workers=False,
        )
    assert exit_code_for(caught.value) == exit_codes.PEER_FAILED


@pytest.mark.parametrize("message", [GLOO_PEER_KILLED, GLOO_PEER_HUNG, GLOO_PAIR_CLOSED])
def test_gloo_errors_from_a_lost_or_hung_peer_are_retryable(message: str) -> None:
    assert exit_code_for(RuntimeError(message)) == exit_codes.PEER_FAILED


def test_a_peer_failure_wrapped_by_the_program_is_still_found() -> None:
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError as inner:
            raise ValueError("batch 17 failed") from inner
    except ValueError as exc:
        assert is_peer_failure(exc)
        assert exit_code_for(exc) == exit_codes.PEER_FAILED


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad shape"),
        KeyError("lr"),
        RuntimeError("CUDA out of memory"),
        ZeroDivisionError(),
    ],
)
def test_the_programs_own_errors_are_fatal(exc: BaseException) -> None:
    assert exit_code_for(exc) == exit_codes.TRAINING_FAILED
    assert exit_code_for(exc) < exit_codes.RETRYABLE_FROM


@pytest.mark.parametrize(
    ("code", "expected"),
    [(None, 0), (0, 0), (3, 3), (143, 143), ("bye", 1), (-1, 1), (256, 1), (2**40, 1)],
)
def test_sys_exit_keeps_the_programs_code(code: object, expected: int) -> None:
    assert exit_code_for(SystemExit(code)) == expected


def test_ctrl_c_is_interrupted() -> None:
    assert exit_code_for(KeyboardInterrupt()) == exit_codes.INTERRUPTED


def test_one_line_keeps_the_first_line_only() -> None:
    assert one_line(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert one_line(ValueError()) == "ValueError"
