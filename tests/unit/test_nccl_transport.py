"""The transport NCCL chose, read from recorded NCCL init logs of each transport
(tests/unit/nccl_logs/: NCCL's real INFO format, each line's source cited there), and the one
line a multi-node job gets when NCCL fell back to TCP sockets where RDMA was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeddp.trainer.constants import ENV_NETWORK_FABRIC
from kubeddp.trainer.worker import nccl_log
from kubeddp.trainer.worker.transport import (
    RdmaDevices,
    capture_nccl_log,
    fallback_warning,
    read_nccl_log,
    visible_rdma,
)

LOGS = Path(__file__).parent / "nccl_logs"
MLX = RdmaDevices(verbs=("uverbs0", "uverbs1"), adapters=("mlx5_0", "mlx5_1"))
EFA = RdmaDevices(verbs=("uverbs0",), adapters=("rdmap16s27",))
NONE = RdmaDevices()


def parsed(name: str) -> nccl_log.NcclTransport:
    return nccl_log.parse((LOGS / f"{name}.log").read_text())


@pytest.mark.parametrize(
    ("name", "kind", "interfaces", "gpudirect", "intra", "described"),
    [
        (
            "infiniband", "infiniband", ("mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"), True,
            "P2P", "infiniband (mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_3:1; GPUDirect RDMA) "
            "between nodes, P2P within",
        ),
        ("roce", "roce", ("mlx5_0:1", "mlx5_1:1"), False, "P2P",
         "roce (mlx5_0:1, mlx5_1:1) between nodes, P2P within"),
        ("efa", "efa", (), True, "P2P",
         "efa (provider efa; GPUDirect RDMA) between nodes, P2P within"),
        ("socket-fallback", "socket", ("eth0",), False, "P2P",
         "socket (eth0) between nodes, P2P within"),
        ("one-node-shm", "socket", ("eth0",), False, "SHM", "socket (eth0), SHM within"),
    ],
)  # fmt: skip
def test_each_transport_is_read_from_its_log(
    name: str, kind: str, interfaces: tuple, gpudirect: bool, intra: str, described: str
) -> None:
    t = parsed(name)
    assert (t.kind, t.interfaces, t.gpudirect, t.intra_node) == (kind, interfaces, gpudirect, intra)
    assert t.describe() == described


def test_the_facts_behind_a_fallback_are_read() -> None:
    fallback = parsed("socket-fallback")
    assert fallback.network == "Socket" and fallback.no_verbs and fallback.nodes == 2
    assert parsed("one-node-shm").no_ib_device and parsed("one-node-shm").nodes == 1
    assert parsed("efa").provider == "efa" and parsed("efa").network == "AWS Libfabric"
    assert not any(parsed(n).warnings for n in ("infiniband", "roce", "efa"))


def test_warn_lines_and_timestamps_are_read_and_other_text_ignored() -> None:
    text = (
        "some unrelated line\n"
        "[2026-01-02 03:04:05] gpu-node-a:64:64 [0] transport/net_ib.cc:820 NCCL WARN NET/IB : "
        "Got async event : port error\n"
        "gpu-node-a:64:64 [0] NCCL INFO Using network Socket\n"
    )
    t = nccl_log.parse(text)
    assert t.network == "Socket" and t.warnings == ("NET/IB : Got async event : port error",)


def test_an_empty_or_missing_log_says_nothing(tmp_path: Path) -> None:
    assert not nccl_log.parse("").known
    assert nccl_log.parse("").describe() == "not in NCCL's log"
    assert not read_nccl_log(tmp_path / "never-written.log").known
    assert not read_nccl_log(None).known


def test_the_log_goes_to_a_private_file_unless_the_user_set_nccl_debug(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    path = capture_nccl_log(env, str(tmp_path))
    assert path is not None and path.parent.parent == tmp_path
    assert env == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(path),
    }  # fmt: skip
    theirs = {"NCCL_DEBUG": "WARN"}
    assert capture_nccl_log(theirs, str(tmp_path)) is None
    assert theirs == {"NCCL_DEBUG": "WARN"}


def test_rdma_devices_are_read_from_dev_and_sysfs(tmp_path: Path) -> None:
    dev, sys_class = tmp_path / "dev", tmp_path / "sys"
    assert not visible_rdma(dev, sys_class).visible  # neither exists: no device plugin
    dev.mkdir()
    sys_class.mkdir()
    for name in ("uverbs1", "uverbs0", "rdma_cm"):
        (dev / name).touch()
    (sys_class / "mlx5_0").mkdir()
    seen = visible_rdma(dev, sys_class)
    assert seen == RdmaDevices(("uverbs0", "uverbs1"), ("mlx5_0",)) and seen.visible


FALLBACK = [
    # (devices, env, the cause's words, the fix's words)
    (MLX, {}, "the image has no libibverbs (rdma-core)", "libibverbs1, ibverbs-providers"),
    (MLX, {"NCCL_IB_DISABLE": "1"}, "NCCL_IB_DISABLE=1 is set", "unset NCCL_IB_DISABLE"),
    (NONE, {ENV_NETWORK_FABRIC: "infiniband"}, "the image has no libibverbs", "install"),
    (NONE, {ENV_NETWORK_FABRIC: "efa"}, "the pod has no EFA device", "vpc.amazonaws.com/efa"),
    (EFA, {ENV_NETWORK_FABRIC: "efa"}, "no OFI plugin", "-efa variant"),
]


@pytest.mark.parametrize(("rdma", "env", "cause", "fix"), FALLBACK)
def test_a_fallback_to_sockets_names_its_cause_and_fix(
    rdma: RdmaDevices, env: dict, cause: str, fix: str
) -> None:
    line = fallback_warning(parsed("socket-fallback"), 2, rdma, env)
    assert line is not None and "\n" not in line
    assert line.startswith("[kubeddp] warning: NCCL sends between nodes over TCP sockets")
    assert cause in line and fix in line and "docs/network.md" in line


def test_no_device_found_with_devices_visible_points_at_the_pods_rdma_setup() -> None:
    no_device = nccl_log.NcclTransport(network="Socket", kind="socket", no_ib_device=True)
    line = fallback_warning(no_device, 2, MLX, {})
    assert line is not None and "RDMA devices are visible in the pod (mlx5_0, mlx5_1)" in line
    assert "IPC_LOCK" in line
    line = fallback_warning(no_device, 2, NONE, {ENV_NETWORK_FABRIC: "roce"})
    assert line is not None and "network.fabric is roce" in line and "rdma/ib" in line


@pytest.mark.parametrize(
    ("name", "nodes", "rdma", "env"),
    [
        ("infiniband", 2, MLX, {}),  # RDMA in use
        ("socket-fallback", 1, MLX, {}),  # one node: nothing goes between nodes
        ("socket-fallback", 2, NONE, {}),  # no devices, no profile: sockets are all there is
        ("socket-fallback", 2, NONE, {ENV_NETWORK_FABRIC: "socket"}),
        ("socket-fallback", 2, NONE, {ENV_NETWORK_FABRIC: "hostNetwork"}),
    ],
)
def test_no_warning_where_sockets_are_expected(name: str, nodes: int, rdma, env: dict) -> None:
    assert fallback_warning(parsed(name), nodes, rdma, env) is None
