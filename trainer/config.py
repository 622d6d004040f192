"""Typed trainer configuration: dataclasses, a YAML file, and `--set section.key=value` overrides.

Unknown keys and wrong types are rejected with the full key path, so a typo in a 40-line YAML
file fails at start-up with one line instead of being silently ignored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key path and the fix."""


@dataclass
class WorkloadConfig:
    name: str = "charlm"  # regression | charlm | custom
    model: str = ""  # custom: "pkg.module:factory" returning an nn.Module (see README)
    data: str = ""  # custom: "pkg.module:factory" returning a Dataset (see README)
    corpus: str = ""  # charlm: a text file or directory; empty = the Python stdlib sources
    corpus_max_bytes: int = 2_000_000
    seq_len: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    samples: int = 4096  # regression: synthetic dataset size
    input_dim: int = 20
    hidden_dim: int = 64


@dataclass
class TrainConfig:
    epochs: int = 1
    max_steps: int = 0  # optimizer steps; 0 = run all epochs
    batch_size: int = 32  # per process, per micro-step
    grad_accum_steps: int = 1
    lr: float = 3e-3
    weight_decay: float = 0.0
    optimizer: str = "adamw"  # adamw | sgd
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0  # 0 disables clipping
    amp: str = "auto"  # auto (bf16 on CUDA, off on CPU) | off | bf16 | fp16
    seed: int = 1234
    eval_every: int = 0  # optimizer steps between evaluations; 0 = end of each epoch
    eval_batches: int = 8
    log_every: int = 10
    num_workers: int = 0  # DataLoader worker processes
    pin_memory: bool = True  # only used on CUDA
    persistent_workers: bool = True  # only with num_workers > 0
    prefetch_factor: int = 2  # only with num_workers > 0
    compile: str = "off"  # off | on | auto (on when training on CUDA); true/false = on/off
    tf32: bool = True  # CUDA: fp32 matmuls may use TF32 tensor cores (10-bit mantissa)
    drop_last: bool = False  # skip each epoch's short last batch (fixed shapes; see docs)
    record_sample_ids: bool = False  # tests: keep the ids each rank trained in the checkpoint


@dataclass
class DDPConfig:
    backend: str = "auto"  # auto (nccl on CUDA, gloo on CPU) | nccl | gloo
    device: str = "auto"  # auto | cuda | cpu
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    find_unused_parameters: bool = False
    startup_timeout_seconds: float = 600.0  # process-group init, first collective
    timeout_seconds: float = 1800.0  # every later collective


@dataclass
class CheckpointConfig:
    dir: str = "checkpoints"
    every_steps: int = 0  # 0 = end of each epoch only
    keep: int = 3
    async_save: bool = True
    resume: str = "auto"  # auto | never | PATH of a checkpoint directory
    weights_only: bool = False  # resume only model weights from an incompatible config
    on_save_error: str = "continue"  # continue | stop
    preempt_grace_seconds: float = 60.0


@dataclass
class MetricsConfig:
    enabled: bool = True
    port: int = 9400  # 0 = pick a free port
    bind: str = "auto"  # auto: 0.0.0.0 in a pod, 127.0.0.1 elsewhere
    pushgateway: str = ""  # host:port to push a final summary to; empty = off
    push_job: str = "kubeddp"


@dataclass
class Config:
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def model_hash(self) -> str:
        """Hash of the settings that decide parameter shapes; a checkpoint must match it."""
        w = self.workload
        keys = {
            "name": w.name,
            "model": w.model,
            "seq_len": w.seq_len,
            "n_layer": w.n_layer,
            "n_head": w.n_head,
            "n_embd": w.n_embd,
            "input_dim": w.input_dim,
            "hidden_dim": w.hidden_dim,
        }
        return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


CHOICES: dict[str, tuple[str, ...]] = {
    "workload.name": ("regression", "charlm", "custom"),
    "train.optimizer": ("adamw", "sgd"),
    "train.amp": ("auto", "off", "bf16", "fp16"),
    "train.compile": ("off", "on", "auto"),
    "ddp.backend": ("auto", "nccl", "gloo"),
    "ddp.device": ("auto", "cuda", "cpu"),
    "checkpoint.on_save_error": ("continue", "stop"),
}


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _float_or_same(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _coerce(path: str, value: Any, typ: Any) -> Any:
    """Check `value` against `typ`; YAML already typed it, so only int -> float widens."""
    if dataclasses.is_dataclass(typ):
        if value is None:  # a section whose keys are all commented out
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{path}' must be a mapping, got {type(value).__name__}")
        return _build(typ, value, path)
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, str):
            value = _float_or_same(value)  # YAML 1.1 reads 3e-4 (no dot) as a string
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ is str:
        if isinstance(value, str):
            return value
        if value is False and "off" in CHOICES.get(path, ()):
            return "off"  # YAML 1.1 reads a bare `off` as false
        if value is True and "on" in CHOICES.get(path, ()):
            return "on"  # and a bare `on` as true (train.compile was a boolean)
    elif isinstance(typ, types.UnionType):
        return value
    name = getattr(typ, "__name__", str(typ))
    raise ConfigError(f"config key '{path}' must be {name}, got {type(value).__name__} {value!r}")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = _field_types(cls)
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            known = ", ".join(sorted(hints))
            raise ConfigError(f"unknown config key '{path}' (known here: {known})")
        kwargs[key] = _coerce(path, value, hints[key])
    obj = cls(**kwargs)
    return obj


def _validate(cfg: Config) -> None:
    for path, allowed in CHOICES.items():
        section, key = path.split(".")
        value = getattr(getattr(cfg, section), key)
        if value not in allowed:
            raise ConfigError(f"config key '{path}' is {value!r}; use one of {', '.join(allowed)}")
    positive = [
        "train.batch_size",
        "train.grad_accum_steps",
        "train.epochs",
        "train.log_every",
        "checkpoint.keep",
        "workload.seq_len",
    ]
    for path in positive:
        section, key = path.split(".")
        if getattr(getattr(cfg, section), key) < 1:
            raise ConfigError(f"config key '{path}' must be >= 1")
    if cfg.workload.name == "custom" and not (cfg.workload.model and cfg.workload.data):
        raise ConfigError(
            "workload.name is 'custom' but workload.model/workload.data are empty; "
            "set both to 'pkg.module:factory'"
        )
    if cfg.workload.n_embd % cfg.workload.n_head:
        raise ConfigError("config key 'workload.n_embd' must be a multiple of 'workload.n_head'")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line report as one line: what went wrong, and where (1-based lines)."""
    parts = []
    for what, mark in (("context", "context_mark"), ("problem", "problem_mark")):
        text, where = getattr(exc, what, None), getattr(exc, mark, None)
        if text:
            parts.append(f"{text} at line {where.line + 1}" if where else text)
    return ": ".join(parts) or type(exc).__name__


def parse_override(text: str) -> tuple[list[str], Any]:
    """`section.key=value` -> (["section", "key"], value parsed as a YAML scalar)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    path, raw = text.split("=", 1)
    keys = path.strip().split(".")
    if len(keys) != 2 or not all(keys):
        raise ConfigError(f"override {text!r}: the key must be section.key, e.g. train.lr=0.001")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"override {text!r}: the value is not valid YAML ({_yaml_problem(exc)}); "
            "quote it, e.g. section.key='[1'"
        ) from None
    return keys, value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read YAML (if given), apply overrides, check every key and type, return a Config."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"config file {p} is not valid YAML ({_yaml_problem(exc)}); fix the syntax"
            ) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of sections")
        data = loaded
    for text in overrides or []:
        (section, key), value = parse_override(text)
        sect = data.get(section)
        if sect is None:
            sect = data[section] = {}
        if not isinstance(sect, dict):
            raise ConfigError(f"config key '{section}' must be a mapping")
        sect[key] = value
    cfg = _build(Config, data)
    _validate(cfg)
    return cfg


def config_from_dict(data: dict[str, Any]) -> Config:
    cfg = _build(Config, data)
    _validate(cfg)
    return cfg


# ---- How a config reaches a process: the --config/--set options (the same for `kubeddp
# launch`, `kubeddp train` and the worker), and launch's hand-off of the config it loaded.

if typing.TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

# Set by `kubeddp launch` for its workers: the config it loaded, as JSON, so no worker reads
# the file or the overrides again (and none can see a different file than launch checked).
ENV_RESOLVED_CONFIG = "KUBEDDP_RESOLVED_CONFIG"


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="trainer YAML config (default: $KUBEDDP_CONFIG)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )


def config_options_argv(path: str | None, overrides: list[str]) -> list[str]:
    """The options as command-line arguments, for a process that parses them again."""
    argv = ["--config", path] if path else []
    for item in overrides:
        argv += ["--set", item]
    return argv


def load_config_options(args: argparse.Namespace, env: Mapping[str, str]) -> Config:
    """The config that --config (else $KUBEDDP_CONFIG) and the --set overrides describe."""
    from kubeddp.trainer.constants import ENV_CONFIG

    return load_config(args.config or env.get(ENV_CONFIG) or None, args.overrides)


def resolved_config_env(cfg: Config) -> dict[str, str]:
    """The environment that hands `cfg` to the workers (see resolved_config)."""
    return {ENV_RESOLVED_CONFIG: json.dumps(cfg.to_dict())}


def resolved_config(env: Mapping[str, str]) -> Config | None:
    """The config `kubeddp launch` resolved for this worker; None when launch did not start it."""
    raw = env.get(ENV_RESOLVED_CONFIG)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConfigError(
            f"${ENV_RESOLVED_CONFIG} is not a JSON config mapping; unset it (kubeddp launch "
            "sets it for its workers) and pass --config/--set instead"
        )
    return config_from_dict(data)
