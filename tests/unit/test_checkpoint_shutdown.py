"""The preemption budget reaches torchrun: the agent waits checkpoint.preempt_grace_seconds
(plus a margin) for the workers' save before it sends SIGKILL."""

from __future__ import annotations

import pytest

from kubeddp.trainer import constants
from kubeddp.trainer.launch import (
    SHUTDOWN_MARGIN_SECONDS,
    preempt_grace_seconds,
    shutdown_timeout_env,
    torchrun_args,
)
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
    env = shutdown_timeout_env(preempt_grace_seconds(worker_args))
    assert env == {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(91 + SHUTDOWN_MARGIN_SECONDS)}
    assert 91 + SHUTDOWN_MARGIN_SECONDS < constants.TERMINATION_GRACE_PERIOD_SECONDS


def test_an_explicit_torchrun_shutdown_timeout_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "5")
    assert shutdown_timeout_env(60) == {}
    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT")
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9")
    assert shutdown_timeout_env(60) == {}


def test_the_installed_torchrun_parser_takes_the_plan_as_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Launch only parses the plan's argv with the installed torch's parser and reads no
    attribute of the result: torch versions differ in which options their parser has."""
    from torch.distributed.run import config_from_args

    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "77")
    args = torchrun_args(_plan(["--set", "train.max_steps=1"]))
    config, _, cmd_args = config_from_args(args)
    assert config.nproc_per_node == 2
    assert cmd_args[-2:] == ["--set", "train.max_steps=1"]
    if "shutdown_timeout" in vars(args):  # torch versions that have the setting honour the env
        assert vars(config)["shutdown_timeout"] == 77


def test_default_grace_fits_the_default_pod_termination_grace() -> None:
    timeout = constants.PREEMPT_GRACE_SECONDS + SHUTDOWN_MARGIN_SECONDS
    assert timeout < constants.TERMINATION_GRACE_PERIOD_SECONDS
