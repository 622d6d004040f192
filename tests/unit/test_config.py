"""Trainer config: YAML + `--set` overrides, and one-line errors that name the key and the fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kubeddp.trainer.config import Config, ConfigError, load_config, parse_override

pytestmark = pytest.mark.timeout(30)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_defaults_without_file() -> None:
    assert load_config(None, []) == Config()


def test_file_then_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        workload:
          name: regression
        train:
          lr: 1
          batch_size: 8
        checkpoint:
          dir: /checkpoints
        """,
    )
    cfg = load_config(path, ["train.batch_size=16", "ddp.backend=gloo", "metrics.enabled=false"])
    assert cfg.workload.name == "regression"
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)  # int widens to float
    assert cfg.train.batch_size == 16  # --set wins over the file
    assert cfg.ddp.backend == "gloo"
    assert cfg.metrics.enabled is False
    assert cfg.checkpoint.dir == "/checkpoints"


def test_exponent_without_dot_is_a_float() -> None:
    # YAML 1.1 reads 3e-4 as a string; users write learning rates that way.
    assert load_config(None, ["train.lr=3e-4"]).train.lr == pytest.approx(3e-4)


def test_empty_file_and_empty_section(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "# nothing yet\n"), []) == Config()
    cfg = load_config(write(tmp_path, "train:\n  # lr: 0.1\n"), ["train.epochs=2"])
    assert cfg.train.epochs == 2


def test_config_roundtrips_through_yaml(tmp_path: Path) -> None:
    cfg = load_config(None, ["train.lr=0.5", "workload.name=regression"])
    path = tmp_path / "effective.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path, []) == cfg


ERRORS = {
    "malformed yaml": ("train:\n  lr: [0.1\n", [], ["flow sequence at line 2", "not valid YAML"]),
    "unknown key": ("train:\n  lrr: 0.1\n", [], ["'train.lrr'", "lr,"]),
    "unknown section": ("trian:\n  lr: 0.1\n", [], ["'trian'", "train"]),
    "wrong type": ("train:\n  batch_size: big\n", [], ["'train.batch_size'", "int", "'big'"]),
    "bool for int": ("train:\n  epochs: true\n", [], ["'train.epochs'", "int"]),
    "string for bool": ("", ["metrics.enabled=maybe"], ["'metrics.enabled'", "bool"]),
    "section not a mapping": ("train: 5\n", [], ["'train'", "mapping"]),
    "top level not a mapping": ("- a\n- b\n", [], ["mapping of sections"]),
    "bad enum": ("", ["train.optimizer=rmsprop"], ["'rmsprop'", "adamw, sgd"]),
    "bad backend": ("ddp:\n  backend: mpi\n", [], ["'ddp.backend'", "'mpi'", "gloo"]),
    "zero batch": ("", ["train.batch_size=0"], ["'train.batch_size'", ">= 1"]),
    # a stall watch that reads every healthy step as a stall ends every run with 203
    "stall below the floor": (
        "",
        ["diagnostics.stall_seconds=1e-9"],
        ["'diagnostics.stall_seconds'", ">= 1"],
    ),
    "heads do not divide": ("", ["workload.n_head=3"], ["workload.n_embd", "workload.n_head"]),
    "custom without factories": ("", ["workload.name=custom"], ["workload.model", "pkg.module"]),
    "set without =": ("", ["train.lr"], ["'train.lr'", "section.key=value"]),
    "set without section": ("", ["lr=0.1"], ["'lr=0.1'", "section.key"]),
    "set too deep": ("", ["train.lr.x=1"], ["'train.lr.x=1'", "section.key"]),
    "set unknown key": ("", ["train.speed=3"], ["'train.speed'"]),
    "set bad yaml": ("", ["train.lr=[1"], ["'train.lr=[1'", "YAML"]),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_config_is_one_line_naming_the_key(case, tmp_path: Path) -> None:
    text, overrides, mentions = ERRORS[case]
    path = write(tmp_path, text) if text else None
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    message = str(err.value)
    assert "\n" not in message, message
    for word in mentions:
        assert word in message, f"{case}: {word!r} not in {message!r}"


def test_unreadable_config_file(tmp_path: Path) -> None:
    for path in (tmp_path / "missing.yaml", tmp_path):
        with pytest.raises(ConfigError, match=f"cannot read config file {path}: "):
            load_config(path, [])


def test_parse_override_types() -> None:
    assert parse_override("train.lr=0.5") == (["train", "lr"], 0.5)
    assert parse_override("checkpoint.dir=/a=b") == (["checkpoint", "dir"], "/a=b")
    assert parse_override("metrics.pushgateway=") == (["metrics", "pushgateway"], "")


def test_bare_off_reads_as_the_off_choice_not_a_bool() -> None:
    # YAML 1.1 reads a bare `off` as false; for a field whose choices include "off" it means "off".
    assert load_config(None, ["train.amp=off"]).train.amp == "off"
    with pytest.raises(ConfigError, match="'ddp.backend' must be str"):
        load_config(None, ["ddp.backend=off"])
