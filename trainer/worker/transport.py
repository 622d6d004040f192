"""Which transport NCCL uses between nodes, said out loud; and when it is sockets by mistake.

Before the process group starts, `capture_nccl_log` points NCCL's INFO log (subsystems INIT and
NET only) at a private file of this process, so the user's log gets none of it; NCCL_DEBUG set
by the user wins (their log is theirs, and kubeddp then reads nothing). After the first
collective has connected NCCL's paths, `read_nccl_log` parses that file (nccl_log.py).

NCCL silently falls back to TCP sockets when it cannot use RDMA: no libibverbs in the image, no
RDMA device in the pod, no OFI plugin for EFA. `fallback_warning` turns that into one line
when the job spans nodes and the pod shows it should not have happened: RDMA devices visible in
the pod, or a fabric profile asked for (KUBEDDP_NETWORK_FABRIC, set by the chart's
network.fabric).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from kubeddp.trainer.constants import ENV_NETWORK_FABRIC
from kubeddp.trainer.worker.nccl_log import NcclTransport, parse

NCCL_DEBUG = "NCCL_DEBUG"
NCCL_DEBUG_SUBSYS = "NCCL_DEBUG_SUBSYS"
NCCL_DEBUG_FILE = "NCCL_DEBUG_FILE"
NCCL_IB_DISABLE = "NCCL_IB_DISABLE"
# Where the kernel shows RDMA devices to a pod: the verbs character devices the device plugin
# mounts, and the sysfs class of RDMA adapters (InfiniBand, RoCE and EFA alike).
DEV_INFINIBAND = Path("/dev/infiniband")
SYS_INFINIBAND = Path("/sys/class/infiniband")
RDMA_FABRICS = ("infiniband", "roce", "efa")
DOCS = "docs/network.md"


def capture_nccl_log(env: MutableMapping[str, str], scratch: str | None = None) -> Path | None:
    """Send NCCL's init log to a private file of this process (set in `env`, read by NCCL when
    the process group starts); None when the user set NCCL_DEBUG."""
    if env.get(NCCL_DEBUG):
        return None
    directory = Path(tempfile.mkdtemp(prefix="kubeddp-nccl-", dir=scratch))
    path = directory / "nccl.log"
    env[NCCL_DEBUG] = "INFO"
    env[NCCL_DEBUG_SUBSYS] = "INIT,NET"
    env[NCCL_DEBUG_FILE] = str(path)
    return path


def read_nccl_log(path: Path | None) -> NcclTransport:
    """The transport in the captured log (empty when nothing was captured or written)."""
    if path is None:
        return NcclTransport()
    try:
        return parse(path.read_text(errors="replace"))
    except OSError:
        return NcclTransport()


@dataclass(frozen=True)
class RdmaDevices:
    """The RDMA devices this pod can see."""

    verbs: tuple[str, ...] = ()  # /dev/infiniband/uverbs*: what a device plugin mounted
    adapters: tuple[str, ...] = ()  # /sys/class/infiniband/*: mlx5_0, rdmap16s27 (EFA), ...

    @property
    def visible(self) -> bool:
        return bool(self.verbs)

    def describe(self) -> str:
        shown = ", ".join(self.adapters) or ", ".join(f"/dev/infiniband/{v}" for v in self.verbs)
        return f"RDMA devices are visible in the pod ({shown})"


def visible_rdma(dev: Path = DEV_INFINIBAND, sys_class: Path = SYS_INFINIBAND) -> RdmaDevices:
    def names(directory: Path, prefix: str = "") -> tuple[str, ...]:
        try:
            return tuple(sorted(p.name for p in directory.iterdir() if p.name.startswith(prefix)))
        except OSError:
            return ()

    return RdmaDevices(names(dev, "uverbs"), names(sys_class))


def fallback_warning(
    transport: NcclTransport, nodes: int, rdma: RdmaDevices, env: Mapping[str, str]
) -> str | None:
    """One line when a multi-node job uses TCP sockets although RDMA was expected (devices in
    the pod, or a fabric profile), naming the cause and the fix; None otherwise."""
    fabric = env.get(ENV_NETWORK_FABRIC, "")
    if transport.kind != "socket" or nodes < 2:
        return None
    if not rdma.visible and fabric not in RDMA_FABRICS:
        return None
    evidence = rdma.describe() if rdma.visible else f"network.fabric is {fabric}"
    cause, fix = _cause_and_fix(transport, rdma, fabric, env)
    return (
        f"[kubeddp] warning: NCCL sends between nodes over TCP sockets although {evidence}: "
        f"{cause}; {fix} (see {DOCS})"
    )


def _cause_and_fix(
    transport: NcclTransport, rdma: RdmaDevices, fabric: str, env: Mapping[str, str]
) -> tuple[str, str]:
    if env.get(NCCL_IB_DISABLE, "0") not in ("", "0"):
        return f"{NCCL_IB_DISABLE}={env[NCCL_IB_DISABLE]} is set", f"unset {NCCL_IB_DISABLE}"
    if fabric == "efa":
        if not rdma.visible:
            return (
                "the pod has no EFA device",
                "request vpc.amazonaws.com/efa (network.fabric=efa does) on EFA instances",
            )
        return (
            "NCCL loaded no OFI plugin (libnccl-net.so)",
            "use the image's -efa variant, which has libfabric and the AWS OFI NCCL plugin",
        )
    if transport.no_verbs:
        return (
            "the image has no libibverbs (rdma-core), so NCCL cannot open the RDMA devices",
            "use kubeddp's CUDA image, or install libibverbs1, ibverbs-providers and librdmacm1",
        )
    if not rdma.visible:
        return (
            "the pod has no RDMA device (/dev/infiniband is empty)",
            "request the RDMA resource of your device plugin (e.g. rdma/ib, "
            "rdma/rdma_shared_device_a or an SR-IOV network) for each pod",
        )
    return (
        "NCCL's InfiniBand transport found no usable device (NET/IB : No device found)",
        "give the container IPC_LOCK and enough locked memory, and check that the device "
        "plugin's resource is the one of the adapters NCCL should use (NCCL_IB_HCA)",
    )


def node_rank(env: Mapping[str, str] = os.environ) -> int:
    """This process's node: torchrun's GROUP_RANK (0 when started alone)."""
    return int(env.get("GROUP_RANK", "0") or 0)
