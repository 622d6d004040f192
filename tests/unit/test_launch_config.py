"""The config is loaded once, by launch: its own --config/--set and those after `--` (as the
manifests pass them) make one config, and the workers get it once, through their environment:
their command line carries none of it. A worker that a user's own torchrun starts reads
--config/--set with the same parser."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubeddp.trainer import constants
from kubeddp.trainer.config import (
    ConfigError,
    load_config,
    load_config_options,
    parse_config_options,
)
from kubeddp.trainer.launcher.agent import WORKER_MODULE
from kubeddp.trainer.launcher.launch import launch_parser
from kubeddp.trainer.launcher.launch_plan import config_options, plan_launch
from kubeddp.trainer.process_contract import (
    ENV_RESOLVED_CONFIG,
    resolved_config,
    resolved_config_env,
)
from kubeddp.trainer.worker.entry import worker_config

pytestmark = pytest.mark.timeout(60)


def _options(*argv: str) -> argparse.Namespace:
    dash = argv.index("--") if "--" in argv else len(argv)
    return config_options(launch_parser().parse_args(argv[:dash]), list(argv[dash + 1 :]))


def _worker_argv(*argv: str) -> list[str]:
    """The command line launch gives torchrun for `kubeddp launch ARGV` on a laptop."""
    dash = argv.index("--") if "--" in argv else len(argv)
    args = launch_parser().parse_args([*argv[:dash], "--nproc-per-node", "2"])
    return plan_launch(args, list(argv[dash + 1 :]), env={}).rdzv.argv


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text("metrics:\n  port: 9555\ntrain:\n  lr: 0.5\n")
    return path


def test_options_after_dash_as_the_manifests_pass_them(config_file: Path) -> None:
    options = _options("--", "--config", str(config_file), "--set", "train.lr=0.1")
    cfg = load_config_options(options, env={})
    assert (cfg.metrics.port, cfg.train.lr) == (9555, 0.1)


def test_own_options_come_first_and_after_dash_overrides_win(config_file: Path) -> None:
    options = _options(
        "--config", str(config_file), "--set", "train.lr=0.2", "--", "--set", "train.lr=0.3"
    )
    assert load_config_options(options, env={}).train.lr == 0.3


def test_config_file_defaults_to_the_env_variable(config_file: Path) -> None:
    env = {constants.ENV_CONFIG: str(config_file)}
    assert load_config_options(_options(), env).metrics.port == 9555


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("--", "--config", "c.yaml", "--set", "train.lr=0.1"),
        ("--config", "c.yaml", "--set", "train.lr=0.2", "--", "--set", "train.lr=0.3"),
    ],
)
def test_the_workers_command_line_carries_no_config(argv: tuple[str, ...]) -> None:
    worker_argv = _worker_argv(*argv)
    assert worker_argv[-2:] == ["--module", WORKER_MODULE]
    assert not {"--config", "--set", "c.yaml"} & set(worker_argv)


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
    """One definition: a worker of a user's own torchrun parses what launch parses."""
    argv = ["--config", "c.yaml", "--set", "a.b=1", "--set", "c.d=2"]
    worker = parse_config_options(argv, "kubeddp worker")
    launch = launch_parser().parse_args(argv)
    assert (worker.config, worker.overrides) == (launch.config, launch.overrides)
    assert (worker.config, worker.overrides) == ("c.yaml", ["a.b=1", "c.d=2"])


def test_a_worker_takes_the_handed_config_or_its_own_options() -> None:
    handed = resolved_config_env(load_config(None, ["train.lr=0.125"]))
    assert worker_config([], handed).train.lr == 0.125
    # a user's own torchrun: `torchrun -m kubeddp.trainer.worker --set ...`
    assert worker_config(["--set", "train.lr=0.25"], {}).train.lr == 0.25
    with pytest.raises(SystemExit) as exit_:
        worker_config(["--lr", "1"], {})
    assert exit_.value.code == 2


def test_arguments_beside_the_handed_config_are_refused_not_ignored() -> None:
    handed = resolved_config_env(load_config(None, ["train.lr=0.125"]))
    with pytest.raises(ConfigError) as err:
        worker_config(["--set", "train.lr=0.5"], handed)
    assert "give --config/--set to kubeddp launch" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_worker_process_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, **resolved_config_env(load_config(None, []))}
    done = subprocess.run(
        [sys.executable, "-m", WORKER_MODULE, "--set", "train.lr=0.5"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "kubeddp: error: --set train.lr=0.5: a worker that kubeddp launch started" in done.stderr
