"""The cluster's fast fabric in one value (`network.fabric`): what each profile adds to the pod.

Each profile adds what its provider documents a pod needs, and nothing else (the sources are
cited in docs/network-fabric.md): the device plugin's resource and its count, the capability
RDMA memory registration needs, or the node's network. `make chart` writes these facts into
the chart's _constants.tpl; templates/_network.tpl applies them, so the chart and `kubeddp
render` (which renders the chart) cannot differ.
"""

from __future__ import annotations

from typing import Any

from kubeddp.trainer import constants as trainer

SOCKET, EFA, INFINIBAND, ROCE, HOST_NETWORK = "socket", "efa", "infiniband", "roce", "hostNetwork"
FABRICS = (SOCKET, EFA, INFINIBAND, ROCE, HOST_NETWORK)
# AWS's EFA device plugin advertises the adapters as this extended resource.
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# EFA adapters per instance type (one per network card with EFA): AWS's "Maximize network
# bandwidth" page (P5, P5e: 32) and the instance types' EfaInfo.MaximumEfaInterfaces. A type
# not listed takes network.devices (`aws ec2 describe-instance-types` says its count).
EFA_DEVICES: dict[str, int] = {
    "p4d.24xlarge": 4,
    "p4de.24xlarge": 4,
    "p5.48xlarge": 32,
    "p5e.48xlarge": 32,
}
# Pinning memory for RDMA (ibv_reg_mr) needs it: the RDMA shared device plugin's example pod
# adds it. Pod Security baseline and restricted do not allow it.
RDMA_CAPABILITY = "IPC_LOCK"
# Pod Security Standards levels, least to most permissive.
POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")
# The level each profile's pods need: IPC_LOCK is outside baseline's capability list and
# hostNetwork is forbidden from baseline up; the rest keeps kubeddp's restricted pods.
LEVEL_NEEDED = {
    SOCKET: "restricted",
    EFA: "restricted",
    INFINIBAND: "privileged",
    ROCE: "privileged",
    HOST_NETWORK: "privileged",
}
WHY_LEVEL = {
    INFINIBAND: f"the container adds {RDMA_CAPABILITY} to pin memory for RDMA",
    ROCE: f"the container adds {RDMA_CAPABILITY} to pin memory for RDMA",
    HOST_NETWORK: "hostNetwork: the pods use the node's network",
}
# A hostNetwork pod resolves cluster names (the rendezvous host's Service) only with this.
HOST_NETWORK_DNS_POLICY = "ClusterFirstWithHostNet"


def constants_for_chart() -> dict[str, Any]:
    """The facts templates/_network.tpl reads (written into _constants.tpl by `make chart`)."""
    return {
        "env": trainer.ENV_NETWORK_FABRIC,
        "socket": SOCKET,
        "hostNetwork": HOST_NETWORK,
        "deviceFabrics": [EFA, INFINIBAND, ROCE],
        "rdmaFabrics": [INFINIBAND, ROCE],
        "efaResource": EFA_RESOURCE,
        "efaDevices": dict(EFA_DEVICES),
        "rdmaCapability": RDMA_CAPABILITY,
        "levelRank": {level: rank for rank, level in enumerate(POD_SECURITY_LEVELS)},
        "levelNeeded": dict(LEVEL_NEEDED),
        "whyLevel": dict(WHY_LEVEL),
        "hostNetworkDnsPolicy": HOST_NETWORK_DNS_POLICY,
    }
