"""The config is loaded once, by launch: its own --config/--set and those after `--` (as the
manifests pass them) make one config, the workers' argv keeps them, and the workers get the
loaded config through their environment."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kubeddp.trainer import constants
from kubeddp.trainer.config import (
    ConfigError,
    add_config_options,
    load_config,
    load_config_options,
)
from kubeddp.trainer.launcher.launch import launch_parser
from kubeddp.trainer.launcher.launch_plan import config_options
from kubeddp.trainer.process_contract import (
    ENV_RESOLVED_CONFIG,
    resolved_config,
    resolved_config_env,
)

pytestmark = pytest.mark.timeout(60)


def _options(*argv: str) -> tuple[argparse.Namespace, list[str]]:
    dash = argv.index("--") if "--" in argv else len(argv)
    return config_options(launch_parser().parse_args(argv[:dash]), list(argv[dash + 1 :]))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text("metrics:\n  port: 9555\ntrain:\n  lr: 0.5\n")
    return path


def test_options_after_dash_as_the_manifests_pass_them(config_file: Path) -> None:
    options, worker_args = _options("--", "--config", str(config_file), "--set", "train.lr=0.1")
    cfg = load_config_options(options, env={})
    assert (cfg.metrics.port, cfg.train.lr) == (9555, 0.1)
    assert worker_args == ["--config", str(config_file), "--set", "train.lr=0.1"]


def test_own_options_come_first_and_after_dash_overrides_win(config_file: Path) -> None:
    options, worker_args = _options(
        "--config", str(config_file), "--set", "train.lr=0.2", "--", "--set", "train.lr=0.3"
    )
    assert load_config_options(options, env={}).train.lr == 0.3
    assert worker_args == [
        *("--config", str(config_file), "--set", "train.lr=0.2"),
        *("--set", "train.lr=0.3"),
    ]


def test_config_file_defaults_to_the_env_variable(config_file: Path) -> None:
    options, worker_args = _options()
    env = {constants.ENV_CONFIG: str(config_file)}
    assert load_config_options(options, env).metrics.port == 9555
    assert worker_args == []  # the workers see the same variable


def test_config_given_before_and_after_dash_is_refused(config_file: Path) -> None:
    with pytest.raises(ConfigError, match="--config is given before and after --"):
        _options("--config", str(config_file), "--", "--config", str(config_file))


def test_an_unknown_worker_flag_is_argparses_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        _options("--", "--lr", "0.1")
    assert exit_.value.code == 2
    assert "unrecognized arguments: --lr 0.1" in capsys.readouterr().err


def test_the_workers_get_the_loaded_config_unchanged() -> None:
    cfg = load_config(None, ["train.lr=3e-4", "workload.name=regression", "ddp.timeout_seconds=5"])
    env = resolved_config_env(cfg)
    handed = resolved_config(env)
    assert handed == cfg and handed.config_hash() == cfg.config_hash()
    assert resolved_config({}) is None


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", json.dumps({"train": {"lr": "x"}})])
def test_a_broken_handoff_is_one_config_error(raw: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolved_config({ENV_RESOLVED_CONFIG: raw})
    assert "\n" not in str(err.value)


def test_the_worker_options_are_the_launch_options() -> None:
    """One definition: the worker's parser takes exactly what launch passes on."""
    worker = argparse.ArgumentParser()
    add_config_options(worker)
    args = worker.parse_args(["--config", "c.yaml", "--set", "a.b=1", "--set", "c.d=2"])
    assert (args.config, args.overrides) == ("c.yaml", ["a.b=1", "c.d=2"])
