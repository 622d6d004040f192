"""The preemption budget reaches torchrun: the agent waits checkpoint.preempt_grace_seconds
(plus a margin) for the workers' save before it sends SIGKILL."""

from __future__ import annotations

import pytest

from kubeddp.trainer import constants
from kubeddp.trainer.launch import SHUTDOWN_MARGIN_SECONDS, preempt_grace_seconds, torchrun_args
from kubeddp.trainer.rendezvous import plan_from_env

pytestmark = pytest.mark.timeout(60)


def _plan(worker_args: list[str]):
    return plan_from_env({}, worker_args, nproc_flag="2")


def test_grace_comes_from_the_workers_config() -> None:
    args = ["--set", "checkpoint.preempt_grace_seconds=7.5"]
    assert preempt_grace_seconds(args) == 7.5
    assert preempt_grace_seconds([]) == constants.PREEMPT_GRACE_SECONDS


def test_a_bad_worker_config_falls_back_to_the_default_grace() -> None:
    assert preempt_grace_seconds(["--set", "nope"]) == constants.PREEMPT_GRACE_SECONDS


def test_torchrun_shutdown_timeout_covers_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT", raising=False)
    worker_args = ["--set", "checkpoint.preempt_grace_seconds=90.2"]
    args = torchrun_args(_plan(worker_args), preempt_grace_seconds(worker_args))
    assert args.shutdown_timeout == 91 + SHUTDOWN_MARGIN_SECONDS
    assert args.shutdown_timeout < constants.TERMINATION_GRACE_PERIOD_SECONDS


def test_an_explicit_torchrun_shutdown_timeout_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "5")
    assert torchrun_args(_plan([]), 60).shutdown_timeout == 5
    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT")
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9")
    assert torchrun_args(_plan([]), 60).shutdown_timeout is None  # torch reads the env itself


def test_default_grace_fits_the_default_pod_termination_grace() -> None:
    timeout = constants.PREEMPT_GRACE_SECONDS + SHUTDOWN_MARGIN_SECONDS
    assert timeout < constants.TERMINATION_GRACE_PERIOD_SECONDS
