"""The preemption budget reaches torchrun: the agent waits checkpoint.preempt_grace_seconds
(plus a margin) for the workers' save before it sends SIGKILL."""

from __future__ import annotations

import pytest

from kubeddp.tools.manifests import k8s_names
from kubeddp.trainer import constants
from kubeddp.trainer.config import Config, ConfigError, load_config_options
from kubeddp.trainer.launcher.agent import (
    SHUTDOWN_MARGIN_SECONDS,
    shutdown_timeout_env,
    torchrun_args,
)
from kubeddp.trainer.launcher.launch import launch_parser
from kubeddp.trainer.launcher.launch_plan import config_options
from kubeddp.trainer.launcher.rendezvous import plan_from_env

pytestmark = pytest.mark.timeout(60)


def _plan(worker_args: list[str]):
    return plan_from_env({}, worker_args, nproc_flag="2")


def _launch_config(*argv: str) -> Config:
    """The config `kubeddp launch ARGV` loads (its own options and those after --)."""
    dash = argv.index("--") if "--" in argv else len(argv)
    own = launch_parser().parse_args(argv[:dash])
    return load_config_options(config_options(own, list(argv[dash + 1 :])), env={})


def test_grace_comes_from_the_launch_config() -> None:
    grace = _launch_config("--", "--set", "checkpoint.preempt_grace_seconds=7.5")
    assert grace.checkpoint.preempt_grace_seconds == 7.5
    own = _launch_config("--set", "checkpoint.preempt_grace_seconds=8")
    assert own.checkpoint.preempt_grace_seconds == 8.0
    assert _launch_config().checkpoint.preempt_grace_seconds == constants.PREEMPT_GRACE_SECONDS


def test_a_bad_config_stops_launch_before_any_grace_is_sized() -> None:
    with pytest.raises(ConfigError, match="section.key=value"):
        _launch_config("--", "--set", "nope")


def test_torchrun_shutdown_timeout_covers_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT", raising=False)
    cfg = _launch_config("--", "--set", "checkpoint.preempt_grace_seconds=90.2")
    env = shutdown_timeout_env(cfg.checkpoint.preempt_grace_seconds)
    assert env == {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(91 + SHUTDOWN_MARGIN_SECONDS)}
    assert 91 + SHUTDOWN_MARGIN_SECONDS < k8s_names.TERMINATION_GRACE_PERIOD_SECONDS


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
    assert timeout < k8s_names.TERMINATION_GRACE_PERIOD_SECONDS
