"""`JobSpec`: everything `kubeddp render` needs to know about one job, and its checks.

The CLI fills a JobSpec from options; the Helm chart's tests build one directly. `check_spec`
rejects bad or unsupported combinations with a `SpecError` that names the CLI option and the fix.
Defaults that differ by kind are `None` here and resolved by `resolved_*` helpers, so a test can
tell "left at default" from "asked for".
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from kubeddp.trainer import __version__, constants
from kubeddp.trainer.config import ConfigError, config_from_dict, parse_override

KINDS = ("pytorchjob", "trainjob", "indexedjob")
PYTORCHJOB_RESTART_POLICIES = ("ExitCode", "OnFailure", "Never", "Always")
INDEXEDJOB_RESTART_POLICIES = ("ExitCode", "OnFailure", "Never")
CLEAN_POD_POLICIES = ("None", "Running", "All")
GANG_SCHEDULERS = {"volcano": "volcano", "scheduler-plugins": "scheduler-plugins-scheduler"}
IMAGE_PULL_POLICIES = ("IfNotPresent", "Always", "Never")
ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
NPROC_WORDS = ("auto", "cpu", "gpu")

DEFAULT_NAME = "kubeddp"
DEFAULT_IMAGE = f"{constants.IMAGE_REPOSITORY}:{__version__}"
DEFAULT_RESTART_POLICY = "ExitCode"
DEFAULT_BACKOFF_LIMIT = 3
DEFAULT_CLEAN_POD_POLICY = "Running"  # after the job ends, stop agents left waiting in a barrier
DEFAULT_MAX_RESTARTS = 3
DEFAULT_ACCESS_MODE = "ReadWriteMany"  # every node mounts the checkpoint volume
TRAINJOB_RUNTIME = "torch-distributed"

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# The longest name whose derived names (`<name>-master-0`, `<name>-config`...) stay valid labels.
MAX_NAME_LENGTH = 40


class SpecError(ValueError):
    """A render option is wrong; the message starts with the option and says how to fix it."""


@dataclass
class JobSpec:
    kind: str = "pytorchjob"
    name: str = DEFAULT_NAME
    namespace: str | None = None
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    nodes: int | None = None  # None: 1, or MAX with --elastic
    nproc_per_node: str | None = None  # None: gpus_per_node when > 0, else "auto"
    gpus_per_node: int = 0
    elastic: tuple[int, int] | None = None
    max_restarts: int = DEFAULT_MAX_RESTARTS
    cpu: str | None = None
    memory: str | None = None
    cpu_limit: str | None = None
    memory_limit: str | None = None
    shm_size: str = constants.SHM_SIZE_DEFAULT
    checkpoint_claim: str | None = None
    checkpoint_size: str | None = None
    storage_class: str | None = None
    checkpoint_access_mode: str = DEFAULT_ACCESS_MODE
    trainer_config: dict[str, Any] = field(default_factory=dict)  # parsed YAML of --config
    overrides: list[str] = field(default_factory=list)  # --set section.key=value
    env: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] | None = None
    priority_class: str | None = None
    queue: str | None = None
    gang: str | None = None
    restart_policy: str | None = None
    backoff_limit: int | None = None
    ttl_seconds_after_finished: int | None = None
    clean_pod_policy: str | None = None
    istio_opt_out: bool = True
    service_account: str | None = None
    podmonitor: bool = False
    podmonitor_labels: dict[str, str] = field(default_factory=dict)


def resolved_nodes(spec: JobSpec) -> int:
    if spec.nodes is not None:
        return spec.nodes
    return spec.elastic[1] if spec.elastic else 1


def resolved_nproc(spec: JobSpec) -> str:
    if spec.nproc_per_node is not None:
        return spec.nproc_per_node
    return str(spec.gpus_per_node) if spec.gpus_per_node > 0 else "auto"


def _fail(option: str, problem: str, fix: str) -> None:
    raise SpecError(f"{option}: {problem}; {fix}")


def _check_quantity(option: str, value: str | None) -> None:
    if value is not None and not QUANTITY.match(value):
        _fail(option, f"{value!r} is not a Kubernetes quantity", "use e.g. 500m, 4, 16Gi")


def _check_common(spec: JobSpec) -> None:
    if spec.kind not in KINDS:
        _fail("KIND", f"unknown kind {spec.kind!r}", f"use one of {', '.join(KINDS)}")
    if not DNS1035.match(spec.name) or len(spec.name) > MAX_NAME_LENGTH:
        _fail(
            "--name",
            f"{spec.name!r} is not a DNS-1035 label of at most {MAX_NAME_LENGTH} characters",
            "use lower-case letters, digits and '-', starting with a letter",
        )
    if spec.namespace is not None and not (
        DNS1123_LABEL.match(spec.namespace) and len(spec.namespace) <= 63
    ):
        _fail(
            "--namespace",
            f"{spec.namespace!r} is not a valid namespace name",
            "use lower-case letters, digits and '-'",
        )
    if not spec.image or any(c.isspace() for c in spec.image):
        _fail("--image", f"{spec.image!r} is not an image reference", "use e.g. repo/name:tag")
    if spec.image_pull_policy not in IMAGE_PULL_POLICIES:
        _fail(
            "--image-pull-policy",
            f"{spec.image_pull_policy!r} is unknown",
            f"use one of {', '.join(IMAGE_PULL_POLICIES)}",
        )
    if resolved_nodes(spec) < 1:
        _fail("--nodes", f"{spec.nodes} is less than 1", "use 1 or more")
    if spec.gpus_per_node < 0:
        _fail("--gpus-per-node", f"{spec.gpus_per_node} is negative", "use 0 for CPU nodes")
    nproc = resolved_nproc(spec)
    if nproc not in NPROC_WORDS and not (nproc.isdigit() and int(nproc) >= 1):
        _fail(
            "--nproc-per-node",
            f"{nproc!r} is not a positive integer or auto/cpu/gpu",
            "use e.g. 8, or auto",
        )
    if spec.gpus_per_node and nproc.isdigit() and int(nproc) > spec.gpus_per_node:
        _fail(
            "--nproc-per-node",
            f"{nproc} processes but only {spec.gpus_per_node} GPUs per node",
            "use at most one process per GPU",
        )
    for option, value in (
        ("--cpu", spec.cpu),
        ("--memory", spec.memory),
        ("--cpu-limit", spec.cpu_limit),
        ("--memory-limit", spec.memory_limit),
        ("--shm-size", spec.shm_size),
        ("--checkpoint-size", spec.checkpoint_size),
    ):
        _check_quantity(option, value)
    if spec.checkpoint_claim and spec.checkpoint_size:
        _fail(
            "--checkpoint-pvc",
            "given together with --checkpoint-size",
            "use an existing claim (--checkpoint-pvc) or a new one (--checkpoint-size), not both",
        )
    if spec.checkpoint_claim is not None and not DNS1123_SUBDOMAIN.match(spec.checkpoint_claim):
        _fail(
            "--checkpoint-pvc",
            f"{spec.checkpoint_claim!r} is not a valid claim name",
            "use the name of an existing PersistentVolumeClaim",
        )
    if spec.storage_class and not spec.checkpoint_size:
        _fail("--storage-class", "only applies to a new claim", "add --checkpoint-size SIZE")
    if spec.checkpoint_access_mode not in ACCESS_MODES:
        _fail(
            "--checkpoint-access-mode",
            f"{spec.checkpoint_access_mode!r} is unknown",
            f"use one of {', '.join(ACCESS_MODES)}",
        )
    for key in spec.env:
        if not ENV_NAME.match(key):
            _fail("--env", f"{key!r} is not a valid variable name", "use K=V with K like MY_VAR")
    if spec.max_restarts < 0:
        _fail("--max-restarts", f"{spec.max_restarts} is negative", "use 0 or more")
    if spec.backoff_limit is not None and spec.backoff_limit < 0:
        _fail("--backoff-limit", f"{spec.backoff_limit} is negative", "use 0 or more")
    if spec.ttl_seconds_after_finished is not None and spec.ttl_seconds_after_finished < 0:
        _fail(
            "--ttl-seconds-after-finished",
            f"{spec.ttl_seconds_after_finished} is negative",
            "use 0 or more seconds",
        )
    if spec.gang is not None and spec.gang not in GANG_SCHEDULERS:
        _fail("--gang", f"{spec.gang!r} is unknown", f"use one of {', '.join(GANG_SCHEDULERS)}")
    if spec.clean_pod_policy is not None and spec.clean_pod_policy not in CLEAN_POD_POLICIES:
        _fail(
            "--clean-pod-policy",
            f"{spec.clean_pod_policy!r} is unknown",
            f"use one of {', '.join(CLEAN_POD_POLICIES)}",
        )
    if spec.podmonitor_labels and not spec.podmonitor:
        _fail("--podmonitor-label", "given without --podmonitor", "add --podmonitor")


def _check_elastic(spec: JobSpec) -> None:
    if spec.elastic is None:
        return
    low, high = spec.elastic
    if low < 1 or low > high:
        _fail("--elastic", f"{low}:{high} needs 1 <= MIN <= MAX", "use e.g. --elastic 2:4")
    nodes = resolved_nodes(spec)
    if not low <= nodes <= high:
        _fail(
            "--nodes",
            f"{nodes} is outside --elastic {low}:{high}",
            "use a node count between MIN and MAX, or leave --nodes out",
        )


def _reject_unsupported(spec: JobSpec) -> None:
    """Options the kind has no field for: an error rather than a silently dropped setting."""
    kind = spec.kind
    if kind != "pytorchjob":
        if spec.elastic is not None:
            _fail("--elastic", f"is for pytorchjob only, not {kind}", "render pytorchjob")
        if spec.gang is not None:
            _fail(
                "--gang",
                f"is for pytorchjob only, not {kind}",
                "render pytorchjob, or use Kueue (--queue)",
            )
        if spec.clean_pod_policy is not None:
            _fail("--clean-pod-policy", f"is for pytorchjob only, not {kind}", "leave it out")
    if kind == "trainjob":
        # Trainer v2.3 runtimePatches cannot change these pod/JobSet fields.
        for option, value in (
            ("--restart-policy", spec.restart_policy),
            ("--backoff-limit", spec.backoff_limit),
            ("--ttl-seconds-after-finished", spec.ttl_seconds_after_finished),
            ("--priority-class", spec.priority_class),
        ):
            if value is not None:
                _fail(
                    option,
                    "cannot be set on a TrainJob (Trainer v2.3 runtimePatches have no such field)",
                    "set it in the ClusterTrainingRuntime, or render pytorchjob",
                )
        nproc = resolved_nproc(spec)
        if not (nproc == "auto" or nproc.isdigit()):
            _fail(
                "--nproc-per-node",
                f"{nproc!r} is not valid for trainjob (numProcPerNode is an integer)",
                "use an integer, or auto to let the runtime decide",
            )
    policies = PYTORCHJOB_RESTART_POLICIES if kind == "pytorchjob" else INDEXEDJOB_RESTART_POLICIES
    if spec.restart_policy is not None and spec.restart_policy not in policies:
        _fail(
            "--restart-policy",
            f"{spec.restart_policy!r} is not valid for {kind}",
            f"use one of {', '.join(policies)}",
        )


def _check_trainer_config(spec: JobSpec) -> None:
    """The trainer would reject a bad key at start-up in every pod; reject it here instead."""
    data = copy.deepcopy(spec.trainer_config)
    for text in spec.overrides:
        try:
            (section, key), value = parse_override(text)
        except ConfigError as exc:
            _fail("--set", str(exc), "use --set section.key=value")
        data.setdefault(section, {})[key] = value
    try:
        config_from_dict(data)
    except ConfigError as exc:
        option = "--set" if spec.overrides else "--config"
        _fail(option, str(exc), "fix the trainer config (see `kubeddp train --help`)")


def check_spec(spec: JobSpec) -> None:
    """Raise SpecError for the first bad option."""
    _check_common(spec)
    _check_elastic(spec)
    _reject_unsupported(spec)
    _check_trainer_config(spec)
