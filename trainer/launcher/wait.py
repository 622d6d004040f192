"""Wait for the rendezvous host: its DNS name first, then its TCP port, under one deadline.

Pods of a job start in any order and a Service's DNS record appears only once its pod runs,
so a worker that tries torchrun at once fails with an opaque error. This turns that race into
a bounded wait and, past the deadline, one line that says which step failed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeddp.trainer.launcher.rendezvous_plan import RendezvousPlan


class RendezvousHostUnreachable(RuntimeError):
    pass


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        return True
    except OSError:
        return False


def _port_open(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_host(
    host: str,
    port: int,
    deadline_seconds: float,
    check_port: bool = True,
    log: Callable[[str], None] = print,
    poll_seconds: float = 1.0,
) -> float:
    """Block until `host` resolves (and `port` accepts, if asked); return seconds waited."""
    start = time.monotonic()
    end = start + deadline_seconds
    announced = False
    step = "DNS name"
    while True:
        ok = _resolves(host)
        if ok and check_port:
            step = "TCP port"
            ok = _port_open(host, port, timeout=min(2.0, max(0.1, end - time.monotonic())))
        if ok:
            return time.monotonic() - start
        if time.monotonic() >= end:
            what = "does not resolve" if step == "DNS name" else f"does not accept on port {port}"
            raise RendezvousHostUnreachable(
                f"rendezvous host {host}:{port} {what} after {deadline_seconds:.0f}s; check that "
                "the master/rank-0 pod is running and its Service exists (kubectl get pods,svc), "
                "or raise KUBEDDP_RDZV_WAIT_SECONDS"
            )
        if not announced:
            log(f"[kubeddp] waiting up to {deadline_seconds:.0f}s for {host}:{port} ({step})")
            announced = True
        time.sleep(poll_seconds)


def _is_local_address(host: str) -> bool:
    """True when `host` resolves to an address of this machine/pod (we host the store)."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return True
            except OSError:
                continue
    return False


def wait_for_rendezvous_host(
    plan: RendezvousPlan, deadline_seconds: float, log: Callable[[str], None]
) -> None:
    """The wait the plan needs before torchrun starts (none for a single node)."""
    if not plan.wait_for_host:
        return
    # The store's host only needs its own name to resolve; everyone else needs the port open.
    hosts_store = plan.node_rank == 0 if plan.rdzv_backend == "static" else None
    if hosts_store is None:
        wait_for_host(plan.host, plan.port, deadline_seconds, check_port=False, log=log)
        hosts_store = _is_local_address(plan.host)
    wait_for_host(plan.host, plan.port, deadline_seconds, check_port=not hosts_store, log=log)
