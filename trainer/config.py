"""Typed trainer configuration: dataclasses, a YAML file, and `--set section.key=value` overrides.

Unknown keys and wrong types are rejected with the full key path, so a typo in a 40-line YAML
file fails at start-up with one line instead of being silently ignored. Every field carries its
doc and constraints (`setting(...)`): one definition serves the validation here, the Helm
chart's schema (`config_json_schema`) and the generated docs/config-reference.md.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import pkgutil
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubeddp.trainer import storage_rules, yaml_io
from kubeddp.trainer.constants import ENV_CONFIG, METRICS_PORT, PREEMPT_GRACE_SECONDS

# Upper bounds: generous for any real run, far from the overflows of C ints and timedelta.
MAX_COUNT = 2**31 - 1
ONE_WEEK_SECONDS = 7 * 24 * 3600.0


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key path and the fix."""


def setting(
    default: Any,
    doc: str,
    *,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    required_when: tuple[str, str] | None = None,
    words: tuple[str, ...] | None = None,
) -> Any:
    """A config field with its one-line doc and constraints (kept in the field's metadata).

    `above` is an exclusive minimum; `required_when=(key, value)` makes a str field required
    (non-empty) when another key of the same section has that value; `words` are the bare
    words a free-text field also takes (`off`: YAML 1.1 reads it as false).
    """
    rules = {
        "choices": choices,
        "words": words,
        "minimum": minimum,
        "maximum": maximum,
        "above": above,
        "required_when": required_when,
    }
    meta = {"doc": doc, **{k: v for k, v in rules.items() if v is not None}}
    if isinstance(default, dict):  # a mapping: each Config gets its own copy
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def default_of(item: dataclasses.Field) -> Any:
    """A setting's default value (also of a mapping, which dataclasses keep as a factory)."""
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return item.default


# Modules of trainer/workloads/ that are not workloads: every other module is one, named after
# its file, so a new workload is one new file there (the registry and these choices follow).
NOT_WORKLOAD_MODULES = ("base", "examples")


def workload_names() -> tuple[str, ...]:
    """The workloads: the modules of trainer/workloads/ (found without importing torch)."""
    found = pkgutil.iter_modules([str(Path(__file__).parent / "workloads")])
    names = (m.name for m in found if not m.name.startswith("_"))
    return tuple(sorted(n for n in names if n not in NOT_WORKLOAD_MODULES))


@dataclass
class WorkloadConfig:
    name: str = setting(
        "charlm",
        "what to train: a built-in workload (`charlm`, `regression`) or `custom` (your model "
        "and data factories; see Workloads)",
        choices=workload_names(),
    )
    model: str = setting(
        "",
        '`custom`: `"pkg.module:factory"` returning the model',
        required_when=("name", "custom"),
    )
    data: str = setting(
        "",
        '`custom`: `"pkg.module:factory"` returning the datasets',
        required_when=("name", "custom"),
    )
    corpus: str = setting(
        "", "`charlm`: a text file or directory; empty = the Python standard library's sources"
    )
    corpus_max_bytes: int = setting(
        2_000_000, "`charlm`: bytes of corpus read at most; 0 = no limit", minimum=0, maximum=2**40
    )
    seq_len: int = setting(64, "`charlm`: context length in bytes", minimum=1, maximum=1 << 20)
    n_layer: int = setting(2, "`charlm`: transformer blocks", minimum=1, maximum=1024)
    n_head: int = setting(
        4, "`charlm`: attention heads; must divide `n_embd`", minimum=1, maximum=1024
    )
    n_embd: int = setting(128, "`charlm`: embedding width", minimum=1, maximum=1 << 16)
    dropout: float = setting(0.0, "`charlm`: dropout probability", minimum=0.0, maximum=0.99)
    samples: int = setting(
        4096, "`regression`: synthetic rows (90% train, 10% eval)", minimum=1, maximum=1 << 30
    )
    input_dim: int = setting(20, "`regression`: input features", minimum=1, maximum=1 << 20)
    hidden_dim: int = setting(64, "`regression`: hidden units", minimum=1, maximum=1 << 20)
    args: dict[str, Any] = setting(
        {},
        "`custom`: your own settings, any mapping (e.g. `{hidden: 256, layers: 4}`); the "
        "factories read them as `cfg.args`",
    )


@dataclass
class TrainConfig:
    epochs: int = setting(1, "passes over the training data", minimum=1, maximum=MAX_COUNT)
    max_steps: int = setting(
        0,
        "stop after this many optimizer steps; 0 = run all epochs",
        minimum=0,
        maximum=MAX_COUNT,
    )
    batch_size: int = setting(
        32,
        "samples per process per micro-step (global batch = this × accumulation × processes)",
        minimum=1,
        maximum=MAX_COUNT,
    )
    grad_accum_steps: int = setting(
        1,
        "micro-steps per optimizer step (gradients are synchronised on the last one only)",
        minimum=1,
        maximum=MAX_COUNT,
    )
    lr: float = setting(3e-3, "peak learning rate", minimum=0.0, maximum=10.0)
    weight_decay: float = setting(0.0, "decoupled weight decay", minimum=0.0, maximum=1.0)
    optimizer: str = setting("adamw", "`adamw`, or `sgd` (momentum 0.9)", choices=("adamw", "sgd"))
    warmup_steps: int = setting(
        10, "linear warm-up steps before the cosine decay", minimum=0, maximum=MAX_COUNT
    )
    min_lr_ratio: float = setting(
        0.1, "the cosine decays to `lr × min_lr_ratio`", minimum=0.0, maximum=1.0
    )
    grad_clip: float = setting(
        1.0, "clip the global gradient norm; 0 = off", minimum=0.0, maximum=1e6
    )
    amp: str = setting(
        "auto",
        "mixed precision: `auto` (bf16 on CUDA, off on CPU), `off`, `bf16`, `fp16` (CUDA only)",
        choices=("auto", "off", "bf16", "fp16"),
    )
    seed: int = setting(
        1234,
        "seed of the model initialisation and the data order (same on every rank)",
        minimum=0,
        maximum=2**32 - 1,
    )
    eval_every: int = setting(
        0,
        "optimizer steps between evaluations; 0 = at the end of each epoch",
        minimum=0,
        maximum=MAX_COUNT,
    )
    eval_batches: int = setting(8, "batches per evaluation and rank", minimum=1, maximum=MAX_COUNT)
    log_every: int = setting(10, "steps between progress lines", minimum=1, maximum=MAX_COUNT)
    num_workers: int = setting(0, "DataLoader worker processes per rank", minimum=0, maximum=256)
    pin_memory: bool = setting(True, "pin host memory for faster copies (CUDA only)")
    persistent_workers: bool = setting(
        True, "keep DataLoader workers between epochs (with `num_workers` > 0)"
    )
    prefetch_factor: int = setting(
        2,
        "batches loaded ahead per DataLoader worker (with `num_workers` > 0)",
        minimum=1,
        maximum=1024,
    )
    compile: str = setting(
        "off",
        "`torch.compile` the model: `off`, `on`, or `auto` (on when training on CUDA with a C "
        "compiler and Python's headers, which Triton builds with; else eager, and the log says "
        "why); `true`/`false` mean `on`/`off`. `on` without the build tools is refused at "
        "start. Short last batches and evaluation run uncompiled, so nothing recompiles at "
        "epoch ends",
        choices=("off", "on", "auto"),
    )
    tf32: bool = setting(
        True,
        "CUDA: fp32 matmuls may use TF32 tensor cores (10-bit mantissa, about 2x faster); "
        "`false` keeps full fp32",
    )
    drop_last: bool = setting(
        False,
        "skip each epoch's short last batch, so every step has the same shape; up to "
        "`batch_size` - 1 samples per rank (a different set each epoch) are not trained that "
        "epoch",
    )
    record_sample_ids: bool = setting(
        False, "keep the sample ids each rank trained in the checkpoint (for tests)"
    )


@dataclass
class DDPConfig:
    backend: str = setting(
        "auto",
        "`auto` (nccl on CUDA, gloo on CPU), `nccl`, `gloo`",
        choices=("auto", "nccl", "gloo"),
    )
    device: str = setting("auto", "`auto`, `cuda`, `cpu`", choices=("auto", "cuda", "cpu"))
    bucket_cap_mb: float = setting(
        25.0, "DDP gradient bucket size in MiB", above=0.0, maximum=65536.0
    )
    gradient_as_bucket_view: bool = setting(
        True, "gradients are views into the buckets (saves a copy)"
    )
    static_graph: bool = setting(False, "tell DDP the graph is the same every step")
    find_unused_parameters: bool = setting(
        False, "for models that skip parameters in some steps (slower)"
    )
    comm_hook: str = setting(
        "none",
        "send less per gradient all-reduce: `none` (DDP's own, full precision), `bf16` or "
        "`fp16` (half the bytes), `powersgd` (low-rank factors, with error feedback; see "
        "docs/network.md)",
        choices=("none", "bf16", "fp16", "powersgd"),
    )
    powersgd_rank: int = setting(
        1,
        "`powersgd`: rank of each gradient's approximation (1-4 typical; higher sends more and "
        "loses less)",
        minimum=1,
        maximum=1024,
    )
    powersgd_start_step: int = setting(
        1000,
        "`powersgd`: optimizer steps of plain all-reduce before compression starts (PyTorch "
        "suggests ~10% of the run; at least 2)",
        minimum=2,
        maximum=MAX_COUNT,
    )
    powersgd_min_compression: float = setting(
        2.0,
        "`powersgd`: a matrix is compressed only when its factors are this many times smaller; "
        "the rest (biases, small layers) go as they are",
        above=0.0,
        maximum=1e6,
    )
    startup_timeout_seconds: float = setting(
        1800.0,
        "process-group start and every collective before the first step (pods start minutes "
        "apart, rank 0 may read a large checkpoint); torch's default for gloo",
        above=0.0,
        maximum=ONE_WEEK_SECONDS,
    )
    timeout_seconds: float = setting(
        600.0,
        "every collective after the first step: a peer that stops participating fails the "
        "others within this time (exit 201, retried); torch's default for NCCL. Keep it above "
        "the longest stall of one rank (a blocking save, an evaluation)",
        above=0.0,
        maximum=ONE_WEEK_SECONDS,
    )


@dataclass
class CheckpointConfig:
    dir: str = setting(
        "checkpoints",
        f"where checkpoints go (`{storage_rules.POD_DIR}` in pods): a directory of their own, "
        "or "
        + " or ".join(f"`{scheme}://bucket/prefix`" for scheme in storage_rules.OBJECT_STORES),
    )
    every_steps: int = setting(
        0,
        "save every N optimizer steps; 0 = at the end of each epoch only",
        minimum=0,
        maximum=MAX_COUNT,
    )
    every_seconds: float = setting(
        1800.0,
        "also save once this many seconds of training passed since the last save, so losing "
        "every pod at once (job deleted, cluster outage) loses at most this much; 0 = off",
        minimum=0.0,
        maximum=ONE_WEEK_SECONDS,
    )
    memory_snapshots: bool = setting(
        True,
        "keep the newest training state in each pod's memory (/dev/shm) as well: a lost pod "
        "resumes from a peer's copy, not from storage (docs/checkpoints.md)",
    )
    memory_every_steps: int = setting(
        0,
        "steps between in-memory snapshots; 0 = as often as keeps their cost under 1% of "
        "the training time (measured)",
        minimum=0,
        maximum=MAX_COUNT,
    )
    keep: int = setting(3, "newest checkpoints kept", minimum=1, maximum=MAX_COUNT)
    async_save: bool = setting(True, "write in a background thread while training continues")
    resume: str = setting(
        "auto", "`auto` (newest valid one in `dir`), `never`, or the path of a checkpoint"
    )
    weights_only: bool = setting(False, "resume only the matching model weights, at step 0")
    on_save_error: str = setting(
        "continue",
        "a failed save: `continue` training, or `stop` on all ranks",
        choices=("continue", "stop"),
    )
    preempt_grace_seconds: float = setting(
        float(PREEMPT_GRACE_SECONDS),
        "after SIGTERM, time to reach a step boundary and save",
        above=0.0,
        maximum=3600.0,
    )
    readers: str = setting(
        "all",
        "with a checkpoint keeper, which pods fetch a program's checkpoints and files: `all` "
        "(every pod: a program that loads on every rank) or `rank0` (only the pod of global "
        "rank 0: a program that loads there and broadcasts). The built-in trainer reads on rank "
        "0 whatever this says; an elastic job's pods all fetch (ranks are given at rendezvous)",
        choices=("all", "rank0"),
    )


@dataclass
class MetricsConfig:
    enabled: bool = setting(True, "serve Prometheus `/metrics`")
    port: int = setting(
        METRICS_PORT,
        "port of `/metrics`; 0 = a free port (printed at start)",
        minimum=0,
        maximum=65535,
    )
    bind: str = setting("auto", "`auto` = `0.0.0.0` in a pod, `127.0.0.1` elsewhere; or an address")
    pushgateway: str = setting("", "`host:port` of a Pushgateway for a final summary; empty = off")
    push_job: str = setting("kubeddp", "Pushgateway job name")
    tensorboard: str = setting(
        "auto",
        "TensorBoard curves from rank 0 (loss, learning rate, throughput, step time, eval loss): "
        "`auto` = `<checkpoint.dir>/tensorboard` when the `tensorboard` package is installed; "
        "`off`; or a directory or `s3://` URL (docs/metrics.md)",
        words=("auto", "off"),
    )
    per_rank: bool = setting(
        False,
        "per-rank detail on `/metrics`: the step-time histogram by rank, and each rank's step, "
        "phase, collectives and busy time: 26 series more per rank (docs/metrics.md)",
    )


@dataclass
class RetriesConfig:
    without_progress: int = setting(
        5,
        "restarts of a pod allowed while the newest checkpoint does not advance; one more and "
        "launch exits 5 (retries exhausted) with the last failure as the pod's termination "
        "message; 0 = no limit. In Kubernetes pods only: elsewhere no operator restarts a run",
        minimum=0,
        maximum=MAX_COUNT,
    )
    rejoin: bool = setting(
        True,
        "when a peer in another pod is lost, this pod stays up and rejoins the rendezvous "
        "(only the lost pod is recreated); false: it exits 201/143 and is recreated too",
    )


# The stall watch looks every stall_seconds / 10, at most every 0.2 s, and a step, a save or a
# collective waiting on the slowest rank takes that long on a healthy run.
MIN_STALL_SECONDS = 1.0


@dataclass
class DiagnosticsConfig:
    enabled: bool = setting(
        True, "per-rank progress records, stall reports, straggler and divergence checks"
    )
    stall_seconds: float = setting(
        180.0,
        "a rank that has not advanced for this long is stalled: its stacks and collectives are "
        "captured (well below the 600 s collective timeout). At least "
        f"{MIN_STALL_SECONDS:g} s: a shorter one reads a healthy step as a stall, and "
        "`on_stall=exit` then ends every run",
        minimum=MIN_STALL_SECONDS,
        maximum=ONE_WEEK_SECONDS,
    )
    on_stall: str = setting(
        "exit",
        "after the stall report: `exit` (code 203, retryable: the pod is replaced) or `wait`",
        choices=("exit", "wait"),
    )
    straggler_factor: float = setting(
        1.5,
        "a rank whose own work per step (its step time less its wait for the others) over the "
        "window is this many times the median of the other ranks is a straggler",
        above=1.0,
        maximum=1000.0,
    )
    straggler_window_seconds: float = setting(
        60.0,
        "the window of step times the straggler verdict looks at",
        above=0.0,
        maximum=ONE_WEEK_SECONDS,
    )
    report_dir: str = setting(
        "",
        "where stall reports are written; empty = `.kubeddp-diagnostics/` in a local "
        "`checkpoint.dir` (with `s3://` checkpoints: the log only)",
    )
    on_nonfinite: str = setting(
        "stop",
        "a non-finite loss or gradient norm: `stop` (code 6, fatal), `keep_last_good` (stop "
        "and remove checkpoints from that step on) or `skip` the step",
        choices=("stop", "keep_last_good", "skip"),
    )


@dataclass
class NetworkConfig:
    check: str = setting(
        "auto",
        "the network check before training: `auto` (on when the job spans several nodes), "
        "`on`, `off`, or `only` (check, then exit without training: a network test of a job's "
        "pods). It reports the job's all-reduce bus bandwidth and names the slowest node pair",
        choices=("auto", "on", "off", "only"),
    )
    check_seconds: float = setting(
        5.0,
        "time the check aims to take; each measurement runs at least once, so a very slow "
        "network can take longer",
        above=0.0,
        maximum=600.0,
    )
    check_max_mb: float = setting(
        64.0,
        "largest message of the check in MiB: all-reduces of 1/64, 1/8 and all of it, and "
        "node-to-node exchanges of it",
        above=0.0,
        maximum=16384.0,
    )
    slow_factor: float = setting(
        1.5,
        "a node pair whose bandwidth is this many times below the median of all pairs is named "
        "slow (with 3 or more nodes)",
        above=1.0,
        maximum=1000.0,
    )
    transport_report: bool = setting(
        True,
        "on NCCL, read the transport NCCL chose from its own log: NCCL_DEBUG=INFO into a "
        "private file, unless you set NCCL_DEBUG yourself",
    )


@dataclass
class Config:
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    retries: RetriesConfig = field(default_factory=RetriesConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)

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
        if w.args:  # a custom model's own sizes (absent when empty: older hashes still match)
            keys["args"] = w.args
        return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def config_fields() -> list[tuple[str, type, dataclasses.Field]]:
    """Every leaf setting as ("section.key", its type, its dataclass field), in file order."""
    out = []
    sections = _field_types(Config)
    for section in dataclasses.fields(Config):
        hints = _field_types(sections[section.name])
        for item in dataclasses.fields(sections[section.name]):
            out.append((f"{section.name}.{item.name}", hints[item.name], item))
    return out


def _choices(path: str) -> tuple[str, ...]:
    for key, _, item in config_fields():
        if key == path:
            return item.metadata.get("choices", ())
    return ()


def _words(path: str) -> tuple[str, ...]:
    for key, _, item in config_fields():
        if key == path:
            return item.metadata.get("words", ())
    return ()


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
        if value is False and "off" in _choices(path) + _words(path):
            return "off"  # YAML 1.1 reads a bare `off` as false
        if value is True and "on" in _choices(path) + _words(path):
            return "on"  # and a bare `on` as true (train.compile was a boolean)
    elif typing.get_origin(typ) is dict:
        if isinstance(value, dict) and all(isinstance(key, str) for key in value):
            return copy.deepcopy(value)
        if isinstance(value, dict):
            raise ConfigError(f"config key '{path}' must be a mapping with text keys")
        raise ConfigError(
            f"config key '{path}' must be a mapping, got {type(value).__name__} {value!r}; "
            f"write e.g. --set '{path}={{hidden: 256}}'"
        )
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


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def range_text(meta: typing.Mapping[str, Any]) -> str:
    """The allowed range of a numeric setting, e.g. ">= 1 and <= 2147483647"."""
    low = f"> {_number(meta['above'])}" if "above" in meta else f">= {_number(meta['minimum'])}"
    return f"{low} and <= {_number(meta['maximum'])}" if "maximum" in meta else low


def _check_setting(path: str, value: Any, meta: typing.Mapping[str, Any], section: Any) -> None:
    """The field's own constraints (its metadata), one line naming the key and the fix."""
    allowed = meta.get("choices")
    if allowed and value not in allowed:
        raise ConfigError(f"config key '{path}' is {value!r}; use one of {', '.join(allowed)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{path}' is {value}; use a finite number")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        below = ("minimum" in meta and value < meta["minimum"]) or (
            "above" in meta and value <= meta["above"]
        )
        if below or ("maximum" in meta and value > meta["maximum"]):
            raise ConfigError(f"config key '{path}' is {value!r}; it must be {range_text(meta)}")
    when = meta.get("required_when")
    if when and getattr(section, when[0]) == when[1] and not value:
        prefix = path.rsplit(".", 1)[0]
        raise ConfigError(
            f"config key '{path}' is empty but '{prefix}.{when[0]}' is {when[1]!r}; "
            "set it to 'pkg.module:factory'"
        )


def _validate(cfg: Config) -> None:
    for path, _, item in config_fields():
        section = getattr(cfg, path.split(".")[0])
        _check_setting(path, getattr(section, item.name), item.metadata, section)
    for key in ("dir", "resume"):
        value = getattr(cfg.checkpoint, key)
        if not value.strip():  # it would mean the working directory
            raise ConfigError(
                f"config key 'checkpoint.{key}' is empty; set it to a directory that holds only "
                "checkpoints (e.g. /checkpoints)" + (", or auto" if key == "resume" else "")
            )
        problem = storage_rules.object_store_problem(value)
        if problem:
            raise ConfigError(f"config key 'checkpoint.{key}': {problem}")
    if cfg.workload.n_embd % cfg.workload.n_head:
        raise ConfigError("config key 'workload.n_embd' must be a multiple of 'workload.n_head'")


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _setting_schema(typ: type, meta: typing.Mapping[str, Any]) -> dict[str, Any]:
    if typing.get_origin(typ) is dict:  # free-form: the factories that read it check it
        return {"type": "object", "description": meta["doc"]}
    node: dict[str, Any] = {"type": _JSON_TYPES[typ], "description": meta["doc"]}
    if "choices" in meta:
        node["enum"] = list(meta["choices"])
    for key, schema_key in (
        ("minimum", "minimum"),
        ("above", "exclusiveMinimum"),
        ("maximum", "maximum"),
    ):
        if key in meta:
            node[schema_key] = meta[key]
    return node


def config_json_schema() -> dict[str, Any]:
    """The config file as a strict JSON schema (draft-07): the Helm chart's `config` value."""
    sections: dict[str, dict[str, Any]] = {}
    for path, typ, item in config_fields():
        name = path.split(".")[0]
        section = sections.setdefault(
            name, {"type": "object", "additionalProperties": False, "properties": {}}
        )
        section["properties"][item.name] = _setting_schema(typ, item.metadata)
        when = item.metadata.get("required_when")
        if when:  # e.g. workload.name custom needs model and data
            key, value = when
            rule = section.setdefault(
                "if",
                {"properties": {key: {"const": value}}, "required": [key]},
            )
            assert rule["properties"][key]["const"] == value, "one required_when per section"
            then = section.setdefault("then", {"properties": {}, "required": []})
            then["properties"][item.name] = {"minLength": 1}
            then["required"].append(item.name)
    return {"type": "object", "additionalProperties": False, "properties": sections}


def parse_override(text: str) -> tuple[list[str], Any]:
    """`section.key=value` -> (["section", "key"], value parsed as a YAML scalar)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    path, raw = text.split("=", 1)
    keys = path.strip().split(".")
    if len(keys) != 2 or not all(keys):
        raise ConfigError(f"override {text!r}: the key must be section.key, e.g. train.lr=0.001")
    try:
        fix = "quote it, e.g. section.key='[1'"
        value = yaml_io.load_one(raw, "the value", fix) if raw.strip() else ""
    except yaml_io.YamlInputError as exc:
        raise ConfigError(f"override {text!r}: {exc}") from None
    return keys, value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read YAML (if given), apply overrides, check every key and type, return a Config."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        try:
            loaded = yaml_io.load_file(p, f"config file {p}")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None
        except yaml_io.YamlInputError as exc:
            raise ConfigError(str(exc)) from None
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
# launch`, `kubeddp train` and a worker that a user's own torchrun starts). Launch loads the
# config once and hands it to its workers in their environment, never as arguments: that
# hand-off is the process contract's (trainer/process_contract.py).

if typing.TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping


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


def parse_config_options(argv: list[str], prog: str) -> argparse.Namespace:
    """--config/--set alone, from `argv` (any other argument: one line, exit 2): what follows
    `--` on launch's command line for the built-in trainer (as the manifests pass it), and the
    command line of a worker that a user's own torchrun started without kubeddp launch."""
    # argparse: only a command line needs this parser, not a config read (kubeddp.api's calls)
    from kubeddp.trainer.arguments import OneLineErrorParser

    parser = OneLineErrorParser(prog=prog, description="the trainer's config options")
    add_config_options(parser)
    return parser.parse_args(argv)


def load_config_options(args: argparse.Namespace, env: Mapping[str, str]) -> Config:
    """The config that --config (else $KUBEDDP_CONFIG) and the --set overrides describe."""
    return load_config(args.config or env.get(ENV_CONFIG) or None, args.overrides)
