"""What a worker learns about the network before it trains: the transport NCCL chose (each
node's first worker reads its NCCL log, transport.py) and the network check (netcheck.py).

Rank 0 says both in the log (the check's line, any fallback warning, and the transport in the
start line); kubeddp_info carries the transport as labels on every pod; the check's results go
to a file in the pod's metrics directory, which launch serves on /metrics
(launcher/network_metrics.py) for `kubeddp status` and the chart's alert rule.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist

from kubeddp.trainer import constants, process_contract
from kubeddp.trainer.config import NetworkConfig
from kubeddp.trainer.worker.distributed import DistContext, gather_objects
from kubeddp.trainer.worker.nccl_log import NcclTransport
from kubeddp.trainer.worker.netcheck_plan import CheckResult, Member
from kubeddp.trainer.worker.transport import (
    capture_nccl_log,
    fallback_warning,
    node_rank,
    read_nccl_log,
    visible_rdma,
)


@dataclass(frozen=True)
class NetworkReport:
    transport: NcclTransport  # this node's, as its first worker read it
    members: list[Member]
    by_pod: dict[str, NcclTransport] = field(default_factory=dict)  # each node's first worker's
    check: CheckResult | None = None

    @property
    def nodes(self) -> int:
        return len({m.node_rank for m in self.members}) or 1

    def describe(self) -> str:
        """`infiniband (...) between nodes, P2P within`, or per pod where the nodes differ;
        empty when NCCL's log was not read (gloo, or NCCL_DEBUG set by the user)."""
        known = {pod: t for pod, t in self.by_pod.items() if t.known}
        kinds = {t.describe() for t in known.values()}
        if len(kinds) <= 1:
            return kinds.pop() if kinds else ""
        return "; ".join(f"{pod}: {t.describe()}" for pod, t in known.items())

    def info_labels(self) -> dict[str, str]:
        """kubeddp_info's transport labels (empty strings when not known, e.g. on gloo)."""
        t = self.transport
        return {
            "transport": t.kind,
            "transport_interfaces": ",".join(t.interfaces),
            "intra_node_transport": t.intra_node,
        }


def prepare(cfg: NetworkConfig, env: MutableMapping[str, str] = os.environ) -> Path | None:
    """Before the process group starts: where NCCL will write its init log (None: nowhere)."""
    return capture_nccl_log(env) if cfg.transport_report else None


def this_member(ctx: DistContext, env: Mapping[str, str] = os.environ) -> Member:
    return Member(
        rank=ctx.rank,
        node_rank=node_rank(env),
        local_rank=int(env.get("LOCAL_RANK", "0") or 0),
        pod=env.get(constants.ENV_POD_NAME) or socket.gethostname(),
        node=env.get(constants.ENV_NODE_NAME, ""),
    )


def check_wanted(cfg: NetworkConfig, nodes: int, rejoined: bool = False) -> bool:
    """`auto`: on a job of several nodes, at its first start; not while it recovers from a
    lost pod (`rejoined`: some pod rejoined the rendezvous), where every second counts."""
    return cfg.check in ("on", "only") or (cfg.check == "auto" and nodes > 1 and not rejoined)


def start(
    cfg: NetworkConfig, ctx: DistContext, nccl_log: Path | None, log: Callable[[str], None]
) -> NetworkReport:
    """Collective: gather who runs where and each node's transport, warn about a fallback to
    sockets, run the check when wanted; rank 0 logs."""
    me = this_member(ctx)
    if not ctx.distributed:
        return NetworkReport(NcclTransport(), [me])
    mine = NcclTransport()
    if ctx.backend == "nccl":
        dist.all_reduce(torch.zeros(1, device=ctx.device))  # NCCL connects its paths here
        if me.local_rank == 0:
            mine = read_nccl_log(nccl_log)
    # NCCL's own node count (its comm line): the job spans nodes as NCCL sees it
    warning = fallback_warning(mine, mine.nodes, visible_rdma(), os.environ)
    rejoined = os.environ.get(process_contract.ENV_REJOINED) == "1"
    everyone = gather_objects((me, mine, warning, rejoined))
    gathered = [(m, t, w) for m, t, w, _ in everyone]
    any_rejoined = any(r for *_, r in everyone)
    members = [m for m, _, _ in gathered]
    firsts = [(m, t) for m, t, _ in gathered if m.local_rank == 0]
    report = NetworkReport(
        transport=next((t for m, t in firsts if m.node_rank == me.node_rank), NcclTransport()),
        members=members,
        by_pod={m.pod: t for m, t in firsts},
    )
    if ctx.is_main:
        _log_warnings(gathered, log)
    if check_wanted(cfg, report.nodes, any_rejoined):
        # the network check, only when network.check asks for it
        from kubeddp.trainer.worker.netcheck import run_check

        report = replace(report, check=run_check(cfg, ctx, members, log))
        if ctx.is_main:
            write_results(report.check)
    return report


def _log_warnings(gathered: list[tuple[Member, NcclTransport, str | None]], log: Callable) -> None:
    pods: dict[str, list[str]] = {}
    for member, _, warning in gathered:
        if warning:
            pods.setdefault(warning, []).append(member.pod)
    for warning, where in pods.items():
        log(f"{warning} [pods: {', '.join(where)}]")


def results_path(env: Mapping[str, str] = os.environ) -> Path | None:
    directory = env.get(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR)
    if not directory or not os.path.isdir(directory):
        return None
    return Path(directory) / process_contract.NETWORK_CHECK_FILE


def write_results(check: CheckResult | None, path: Path | None = None) -> None:
    """The check's results as JSON, replaced whole (the launcher's /metrics reads it)."""
    path = path or results_path()
    if check is None or path is None:
        return
    v = check.verdict
    data = {
        "seconds": check.seconds,
        "bus": {str(n): bw for n, bw in check.bus.items()},
        "median": v.median if v else 0.0,
        "slowest": (
            {"a": asdict(v.slowest.a), "b": asdict(v.slowest.b), "bps": v.slowest.bytes_per_second}
            if v and v.slowest
            else None
        ),
        "slow_ratio": v.ratio if v and v.slow else 0.0,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
