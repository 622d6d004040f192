"""The transport NCCL chose, read from its own INFO log (NCCL_DEBUG=INFO, subsystems INIT,NET).

A pure function of the log's text, so every transport is tested with recorded logs
(tests/unit/nccl_logs/, whose README cites the NCCL source line of each format):

- `Using network IB` (init.cc): the network between nodes: `IB` (InfiniBand and RoCE verbs),
  `Socket` (TCP), or an external plugin's own name (`AWS Libfabric` for EFA);
- `NET/IB : Using [0]mlx5_0:1/IB ...`, `NET/Socket : Using [0]eth0:10.0.0.11<0>`: its devices;
- `NET/OFI Selected provider is efa, ...` (the AWS OFI NCCL plugin): the libfabric provider;
- `Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`, `... via NET/IB/0/GDRDMA`: the paths NCCL
  connected, inside the node (P2P: NVLink or PCIe; SHM: host memory) and to other nodes
  (`GDRDMA`: GPUDirect RDMA);
- why it fell back to sockets: `Failed to open libibverbs.so[.1]` (no rdma-core in the image),
  `NET/IB : No device found.` (no RDMA device in the pod), `NET/Plugin: Could not find: ...`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Every INFO/WARN line: [optional timestamp] host:pid:tid [cudaDev] [file:line ]NCCL LEVEL msg
_LINE = re.compile(r"\[\d+\] (?:\S+:\d+ )?NCCL (INFO|WARN) (.*)$")
_NETWORK = re.compile(r"^Using network (.+)$")
_IB_DEVICES = re.compile(r"^NET/IB : Using(.*?)(?: \[RO\])? ?; OOB (\S+?):")
_IB_DEVICE = re.compile(r"\[\d+\](\S+?)/(IB|RoCE|UNSPECIFIED)\b")
_SOCKET_DEVICES = re.compile(r"^NET/Socket : Using(.*)$")
_SOCKET_DEVICE = re.compile(r"\[\d+\]([^:\s]+):")
_OFI_PROVIDER = re.compile(r"^NET/OFI Selected provider is ([^,\s]+), fabric is (\S+)")
_PLUGIN = re.compile(r"^NET/Plugin: Loaded net plugin (.+) \(v\d+\)$")
_NODES = re.compile(r"^comm \S+ rank \d+ nRanks \d+ nNodes (\d+) ")
_CHANNEL = re.compile(r"^Channel \d+(?:/\d+)? : .* via (.+)$")
_NET_PATH = re.compile(r"^NET/(.+)/\d+(?:\(\d+\))?(\S*)$")

NO_VERBS = "Failed to open libibverbs.so[.1]"
NO_IB_DEVICE = "NET/IB : No device found."

# What the start line and kubeddp_info call each network (the `transport` label)
KINDS = {"IB": "infiniband", "Socket": "socket"}
OFI_NETWORKS = ("AWS Libfabric", "OFI")


@dataclass(frozen=True)
class NcclTransport:
    """What one process's NCCL log says; empty strings where the log does not say."""

    network: str = ""  # NCCL's name of the network between nodes: IB, Socket, AWS Libfabric
    kind: str = ""  # infiniband, roce, efa, ofi, socket, or a plugin's name in lower case
    interfaces: tuple[str, ...] = ()  # mlx5_0:1, ... or eth0 (the NICs the network uses)
    provider: str = ""  # the libfabric provider of the OFI plugin (efa, ...)
    gpudirect: bool = False  # a path to another node reads/writes GPU memory (GDRDMA)
    intra_node: str = ""  # P2P (NVLink or PCIe peer copies), SHM (host memory), or both
    nodes: int = 0  # nNodes of the first communicator; 0 when not logged
    no_verbs: bool = False  # libibverbs could not be opened: no rdma-core in the image
    no_ib_device: bool = False  # libibverbs found no usable RDMA device
    warnings: tuple[str, ...] = ()  # NCCL's WARN lines, in order

    @property
    def known(self) -> bool:
        return bool(self.network)

    def describe(self) -> str:
        """`infiniband (mlx5_0:1, mlx5_1:1; GPUDirect RDMA) between nodes, P2P within`."""
        if not self.known:
            return "not in NCCL's log"
        detail = ", ".join(self.interfaces)
        if self.provider:
            detail = f"provider {self.provider}" + (f", {detail}" if detail else "")
        if self.gpudirect:
            detail += ("; " if detail else "") + "GPUDirect RDMA"
        text = self.kind + (f" ({detail})" if detail else "")
        if self.nodes != 1:
            text += " between nodes"
        return text + (f", {self.intra_node} within" if self.intra_node else "")


def _kind(network: str, links: set[str], provider: str) -> str:
    if network == "IB" and links == {"RoCE"}:
        return "roce"
    if network in OFI_NETWORKS:
        return "efa" if provider == "efa" else "ofi"
    return KINDS.get(network, network.lower())


def parse(text: str) -> NcclTransport:
    """The transport of the first communicator in `text` (the file NCCL_DEBUG_FILE names)."""
    network = provider = ""
    nodes = 0
    links: set[str] = set()
    ib_devices: list[str] = []
    socket_devices: list[str] = []
    intra: set[str] = set()
    gpudirect = no_verbs = no_ib_device = False
    warnings: list[str] = []
    for line in text.splitlines():
        found = _LINE.search(line)
        if not found:
            continue
        level, msg = found.groups()
        if level == "WARN":
            warnings.append(msg)
            continue
        if (m := _NETWORK.match(msg)) and not network:
            network = m.group(1)
        elif (m := _IB_DEVICES.match(msg)) and not ib_devices:
            for name, link in _IB_DEVICE.findall(m.group(1)):
                ib_devices.append(name)
                links.add(link)
        elif (m := _SOCKET_DEVICES.match(msg)) and not socket_devices:
            socket_devices = _SOCKET_DEVICE.findall(m.group(1))
        elif m := _OFI_PROVIDER.match(msg):
            provider = provider or m.group(1)
        elif (m := _NODES.match(msg)) and not nodes:
            nodes = int(m.group(1))
        elif m := _CHANNEL.match(msg):
            path = m.group(1)
            net = _NET_PATH.match(path)
            if net:
                gpudirect = gpudirect or "/GDRDMA" in net.group(2)
            else:
                intra.add(path.split("/", 1)[0])
        elif msg == NO_VERBS:
            no_verbs = True
        elif msg == NO_IB_DEVICE:
            no_ib_device = True
    interfaces = ib_devices if network == "IB" else socket_devices if network == "Socket" else []
    return NcclTransport(
        network=network,
        kind=_kind(network, links, provider) if network else "",
        interfaces=tuple(interfaces),
        provider=provider,
        gpudirect=gpudirect,
        intra_node="+".join(sorted(intra)),
        nodes=nodes,
        no_verbs=no_verbs,
        no_ib_device=no_ib_device,
        warnings=tuple(warnings),
    )
