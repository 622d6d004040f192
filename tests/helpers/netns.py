"""Network namespaces as cluster nodes, for multi-node tests on one machine (root only).

    with netns.cluster(["demo-worker-0", "demo-worker-1"]) as nodes:
        argv = nodes[0].wrap(["kubeddp", "launch", ...])  # runs "inside" node 0

Layout: one namespace per node (`kddp-<uid>-<i>`) with `eth0` at 198.51.100.<10+i>/24
(TEST-NET-2, never a real address) and `lo` up, plus one namespace `kddp-<uid>-sw` holding the
bridge that connects them, so no interface or address is ever added to the host's own network.
`/etc/netns/<ns>/hosts` maps every node's name to its address (`ip netns exec` bind-mounts it
over /etc/hosts), like the per-replica Services of a PyTorchJob; each command also runs in its
own UTS namespace whose hostname is the node's name, as in a pod. Teardown removes the
namespaces (which removes their veths) and the /etc/netns directories, also after a failure.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.privileges import require_root as require_root_for

SUBNET = ipaddress.ip_network("198.51.100.0/24")
FIRST_HOST = 10
NETNS_ETC = Path("/etc/netns")
PREFIX = "kddp-"


def require_root() -> None:
    """Skip (with the reason) where namespaces cannot be made; in CI (CI=true) fail instead."""
    require_root_for("ip", "unshare", what="a network-namespace test")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class Node:
    namespace: str
    hostname: str
    address: str

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this node: its network namespace, hosts file and hostname."""
        set_hostname = 'hostname "$0" && exec "$@"'
        return [
            "ip", "netns", "exec", self.namespace,
            "unshare", "--uts", "--", "sh", "-c", set_hostname, self.hostname, *argv,
        ]  # fmt: skip


def _kill_inside(namespace: str) -> None:
    done = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30
    )
    for pid in done.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _remove(namespace: str) -> None:
    with contextlib.suppress(Exception):
        _kill_inside(namespace)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
    shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)


@contextlib.contextmanager
def cluster(hostnames: Sequence[str]) -> Iterator[list[Node]]:
    """Nodes named `hostnames`, reachable from each other by those names; removed on exit."""
    require_root()
    if not 1 <= len(hostnames) <= 200:
        raise ValueError(f"{len(hostnames)} nodes: use 1 to 200")
    uid = uuid.uuid4().hex[:6]
    switch = f"{PREFIX}{uid}-sw"
    hosts = list(SUBNET.hosts())
    nodes = [
        Node(f"{PREFIX}{uid}-{i}", name, str(hosts[FIRST_HOST - 1 + i]))
        for i, name in enumerate(hostnames)
    ]
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.hostname}\n" for n in nodes)
        for i, node in enumerate(nodes):
            _ip("netns", "add", node.namespace)
            made.append(node.namespace)
            etc = NETNS_ETC / node.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            port = f"p{i}"
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", node.namespace)  # fmt: skip
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/{SUBNET.prefixlen}",
                "dev", "eth0")  # fmt: skip
            _ip("-n", node.namespace, "link", "set", "eth0", "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
        yield nodes
    finally:
        for namespace in reversed(made):
            _remove(namespace)
        for node in nodes:
            shutil.rmtree(NETNS_ETC / node.namespace, ignore_errors=True)
