"""The `kubeddp render` options: argparse definitions and their conversion into a `JobSpec`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from kubeddp.tools.jobspec import (
    DEFAULT_IMAGE,
    DEFAULT_NAME,
    GANG_SCHEDULERS,
    KINDS,
    JobSpec,
    SpecError,
)
from kubeddp.trainer import constants as C


def add_render_options(parser: argparse.ArgumentParser, kind_required: bool = True) -> None:
    parser.add_argument(
        "kind",
        choices=KINDS,
        nargs=None if kind_required else "?",
        help="pytorchjob (Kubeflow v1), trainjob (Trainer v2.3), indexedjob "
        "(batch/v1, no operator)",
    )
    job = parser.add_argument_group("job")
    job.add_argument("--name", default=DEFAULT_NAME, help="job name (DNS-1035 label)")
    job.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig's)")
    job.add_argument("--image", default=DEFAULT_IMAGE)
    job.add_argument("--image-pull-policy", default="IfNotPresent")
    job.add_argument("--nodes", type=int, help="pods (default 1; MAX with --elastic)")
    job.add_argument(
        "--nproc-per-node",
        help="processes per pod: N, auto, cpu, gpu (default: --gpus-per-node, else auto)",
    )
    job.add_argument("--gpus-per-node", type=int, default=0, help="nvidia.com/gpu per pod")
    job.add_argument("--elastic", metavar="MIN:MAX", help="elastic PyTorchJob (c10d rendezvous)")
    job.add_argument("--max-restarts", type=int, default=3, help="elastic: torchrun restarts")
    res = parser.add_argument_group("resources and storage")
    res.add_argument("--cpu", help="CPU request per pod, e.g. 8")
    res.add_argument("--memory", help="memory request per pod, e.g. 64Gi")
    res.add_argument("--cpu-limit")
    res.add_argument("--memory-limit")
    res.add_argument("--shm-size", default=C.SHM_SIZE_DEFAULT, help="/dev/shm memory emptyDir")
    res.add_argument("--checkpoint-pvc", metavar="CLAIM", help="existing PVC for /checkpoints")
    res.add_argument("--checkpoint-size", metavar="SIZE", help="render a new PVC of this size")
    res.add_argument("--storage-class", help="storage class of the new PVC")
    res.add_argument("--checkpoint-access-mode", default="ReadWriteMany")
    run = parser.add_argument_group("trainer")
    run.add_argument("--config", metavar="FILE", help="trainer config YAML (shipped as ConfigMap)")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="trainer config override (repeatable)",
    )
    run.add_argument("--env", action="append", default=[], metavar="K=V")
    pod = parser.add_argument_group("scheduling")
    pod.add_argument("--node-selector", action="append", default=[], metavar="K=V")
    pod.add_argument("--tolerations", metavar="YAML|FILE", help="a YAML/JSON list or a file")
    pod.add_argument("--affinity", metavar="YAML|FILE", help="a YAML/JSON mapping or a file")
    pod.add_argument("--priority-class")
    pod.add_argument("--queue", help="Kueue LocalQueue (label kueue.x-k8s.io/queue-name)")
    pod.add_argument("--gang", choices=sorted(GANG_SCHEDULERS), help="gang scheduling (pytorchjob)")
    pod.add_argument("--restart-policy", help="ExitCode (default), OnFailure, Never, Always")
    pod.add_argument("--backoff-limit", type=int)
    pod.add_argument("--ttl-seconds-after-finished", type=int)
    pod.add_argument("--clean-pod-policy", help="pytorchjob: None, Running (default), All")
    pod.add_argument(
        "--istio-opt-out",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="annotate pods sidecar.istio.io/inject=false (default on)",
    )
    pod.add_argument("--service-account", help="default: none, token not mounted")
    mon = parser.add_argument_group("monitoring")
    mon.add_argument(
        "--podmonitor",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="render a Prometheus Operator PodMonitor",
    )
    mon.add_argument(
        "--podmonitor-label",
        action="append",
        default=[],
        metavar="K=V",
        help="extra PodMonitor label, e.g. release=kube-prometheus-stack",
    )


def parse_pairs(option: str, items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{option}: {item!r} is not K=V; write e.g. {option} KEY=value")
        out[key] = value
    return out


def parse_elastic(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    low, sep, high = text.partition(":")
    if not (sep and low.isdigit() and high.isdigit()):
        raise SpecError(f"--elastic: {text!r} is not MIN:MAX; write e.g. --elastic 2:4")
    return int(low), int(high)


def parse_yaml_option(option: str, text: str | None, want: type) -> Any:
    """A YAML/JSON value given inline or as a path to a file."""
    if text is None:
        return None
    path = Path(text)
    source = path.read_text() if path.is_file() else text
    try:
        value = yaml.safe_load(source)
    except yaml.YAMLError:
        raise SpecError(
            f"{option}: {text!r} is neither a file nor valid YAML/JSON; "
            "pass a file path or an inline value"
        ) from None
    if not isinstance(value, want):
        raise SpecError(
            f"{option}: must be a YAML {want.__name__}, got "
            f"{type(value).__name__}; see `kubectl explain pod.spec`"
        )
    return value


def read_trainer_config(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"--config: cannot read {path} ({exc.strerror}); check the path") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise SpecError(f"--config: {path} is not valid YAML; fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"--config: {path} must hold a mapping of sections (workload, train...)")
    return json.loads(json.dumps(data))  # plain types only


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    return JobSpec(
        kind=args.kind,
        name=args.name,
        namespace=args.namespace,
        image=args.image,
        image_pull_policy=args.image_pull_policy,
        nodes=args.nodes,
        nproc_per_node=args.nproc_per_node,
        gpus_per_node=args.gpus_per_node,
        elastic=parse_elastic(args.elastic),
        max_restarts=args.max_restarts,
        cpu=args.cpu,
        memory=args.memory,
        cpu_limit=args.cpu_limit,
        memory_limit=args.memory_limit,
        shm_size=args.shm_size,
        checkpoint_claim=args.checkpoint_pvc,
        checkpoint_size=args.checkpoint_size,
        storage_class=args.storage_class,
        checkpoint_access_mode=args.checkpoint_access_mode,
        trainer_config=read_trainer_config(args.config),
        overrides=list(args.overrides),
        env=parse_pairs("--env", args.env),
        node_selector=parse_pairs("--node-selector", args.node_selector),
        tolerations=parse_yaml_option("--tolerations", args.tolerations, list) or [],
        affinity=parse_yaml_option("--affinity", args.affinity, dict),
        priority_class=args.priority_class,
        queue=args.queue,
        gang=args.gang,
        restart_policy=args.restart_policy,
        backoff_limit=args.backoff_limit,
        ttl_seconds_after_finished=args.ttl_seconds_after_finished,
        clean_pod_policy=args.clean_pod_policy,
        istio_opt_out=args.istio_opt_out,
        service_account=args.service_account,
        podmonitor=args.podmonitor,
        podmonitor_labels=parse_pairs("--podmonitor-label", args.podmonitor_label),
    )
