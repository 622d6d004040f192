"""The last check of what a user (or an env) gave launch, before any wait or process starts.

Every plan passes through `check_plan`, whatever built it (flags, an operator's env, nothing):
a host that cannot be a host, a port outside 1-65535, counts no machine holds, a rendezvous
backend torch does not have, or a PET_RDZV_CONF torchrun would refuse is one line and exit 2
now, not a 10-minute wait for a host that never resolves followed by a retryable exit 200.
"""

from __future__ import annotations

import ipaddress
import re
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from kubeddp.trainer.launcher.rendezvous_plan import RendezvousError

if TYPE_CHECKING:
    from kubeddp.trainer.launcher.rendezvous_plan import RendezvousPlan

MAX_NPROC_PER_NODE = 1024  # workers on one node: more GPUs or cores than any node has
MAX_NNODES = 100_000  # nodes in one job: beyond the largest Kubernetes clusters (~65k nodes)
MAX_HOST_CHARS = 253  # a DNS name's limit (RFC 1035)
MAX_RDZV_ID_CHARS = 253
TORCH_RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2", "static")
_DNS_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_RDZV_ID = re.compile(r"[^\s\x00-\x1f\x7f]+")  # any text torchrun can pass on: no blanks
# PET_RDZV_CONF keys torch reads as whole numbers (seconds or counts).
_WHOLE_NUMBER_KEYS = re.compile(r".*(timeout|interval|attempt)")


def host_problem(host: str) -> str | None:
    """Why `host` cannot be a rendezvous host (None: it can). An IPv6 address may come in
    brackets; a host:port, spaces or an empty name cannot."""
    if not host:
        return "is empty; give the host name or IP address of node rank 0"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return None
    except ValueError:
        pass
    if ":" in host:
        return "is not a host (a host:port? give the port with --master-port)"
    if len(host) > MAX_HOST_CHARS:
        return f"is longer than {MAX_HOST_CHARS} characters, a DNS name's limit"
    if not all(_DNS_LABEL.fullmatch(label) for label in host.rstrip(".").split(".")):
        return "is not a DNS name or IP address (letters, digits, '-' and '.' only)"
    return None


def rdzv_backends() -> tuple[str, ...]:
    """torch's rendezvous backends and the plugins installed for torchrun (not imported)."""
    plugins = tuple(entry.name for entry in entry_points(group="torchrun.handlers"))
    return (*TORCH_RDZV_BACKENDS, *plugins)


def rdzv_conf_problem(conf: str) -> str | None:
    """torchrun's `key=value,...` format, with whole numbers where torch reads them."""
    if not conf.strip():
        return None
    for item in conf.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not key or not sep or not value:
            return f"item {item!r} is not key=value"
        if _WHOLE_NUMBER_KEYS.fullmatch(key) and not (value.isascii() and value.isdigit()):
            return f"{key}={value!r} must be a whole number of seconds or attempts"
    return None


def _endpoint_name(plan: RendezvousPlan) -> str:
    return "the master address" if plan.rdzv_backend == "static" else "the rendezvous endpoint"


def check_plan(plan: RendezvousPlan) -> None:
    """Raise RendezvousError (exit 2) for a plan that no wait or retry could make work."""
    if not 1 <= plan.nproc_per_node <= MAX_NPROC_PER_NODE:
        raise RendezvousError(
            f"{plan.nproc_per_node} workers per node is outside 1-{MAX_NPROC_PER_NODE}; give "
            "the number of GPUs (or CPU workers) of one node"
        )
    highest = int(plan.nnodes.split(":")[-1])
    if highest > MAX_NNODES:
        raise RendezvousError(
            f"nnodes {plan.nnodes} is more than {MAX_NNODES} nodes; give the job's real node count"
        )
    if plan.source in ("standalone", "torchrun"):
        return  # torchrun picks (or picked) the local port itself
    host = plan.host
    problem = host_problem(host)
    if problem:
        raise RendezvousError(f"{_endpoint_name(plan)} {host!r} {problem}")
    if not 1 <= plan.port <= 65535:
        raise RendezvousError(
            f"{_endpoint_name(plan)} port {plan.port} is not a TCP port; use 1-65535"
        )
    if plan.rdzv_backend not in rdzv_backends():
        raise RendezvousError(
            f"rendezvous backend {plan.rdzv_backend!r} (PET_RDZV_BACKEND) is not one torch has; "
            f"use one of {', '.join(rdzv_backends())} (c10d unless you run etcd)"
        )
    problem = rdzv_conf_problem(plan.rdzv_conf)
    if problem:
        raise RendezvousError(
            f"PET_RDZV_CONF={plan.rdzv_conf!r}: {problem}; torchrun takes key=value,key=value "
            "(e.g. join_timeout=900)"
        )
    if len(plan.rdzv_id) > MAX_RDZV_ID_CHARS or not _RDZV_ID.fullmatch(plan.rdzv_id):
        raise RendezvousError(
            f"rendezvous id {plan.rdzv_id!r} must be 1-{MAX_RDZV_ID_CHARS} characters without "
            "spaces (the same on every node, e.g. the job's name)"
        )
