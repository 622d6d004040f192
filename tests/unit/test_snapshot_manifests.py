"""Every kind's pods hold their in-memory snapshots (trainer/worker/snapshot/): the snapshot
directory on the pod's memory-backed /dev/shm, that volume and the pod's memory grown by two
snapshots (sized from the built-in trainer's config, or memorySnapshots.size), the container's
QoS class kept, and a given size that cannot hold the state refused in one line."""

from __future__ import annotations

import pytest

from kubeddp.tools.manifests.chart.render import RenderError
from kubeddp.trainer import constants as C
from kubeddp.trainer import state_size
from kubeddp.trainer.config import load_config
from tests.helpers.render import job_of

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20


def pod_spec(kind: str, *argv: str) -> dict:
    job = job_of(kind, "--name", "s", *argv)
    if kind == "pytorchjob":
        return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    if kind == "indexedjob":
        return job["spec"]["template"]["spec"]
    raise ValueError(kind)


def shm(spec: dict) -> str:
    (volume,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert volume["emptyDir"]["medium"] == "Memory"
    return volume["emptyDir"]["sizeLimit"]


def _sections(cfg):  # noqa: ANN001, ANN202
    return cfg.workload, cfg.train


def mib(config: list[str]) -> int:
    """Two snapshots of the state `config` describes, in whole MiB (as the chart writes it)."""
    return -(-2 * (state_size.snapshot_bytes(*_sections(load_config(None, config))) or 0) // MIB)


@pytest.mark.parametrize("kind", ["pytorchjob", "indexedjob"])
def test_the_pod_keeps_two_snapshots_of_the_state_its_config_describes(kind: str) -> None:
    config = ["workload.n_layer=12", "workload.n_embd=768", "workload.seq_len=1024"]
    sets = [item for c in config for item in ("--set", c)]
    spec = pod_spec(kind, "--shm-size", "1Gi", "--memory", "4Gi", *sets)
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[C.ENV_SNAPSHOT_DIR] == C.POD_SNAPSHOT_DIR
    snapshots = mib(config)
    assert 1000 < snapshots < 2000  # a GPT-2-small-sized charlm with AdamW: 2 x ~0.7 GiB
    assert shm(spec) == f"{1024 + snapshots}Mi"
    assert container["resources"]["requests"]["memory"] == f"{4096 + snapshots}Mi"


def test_a_given_size_wins_and_zero_reserves_nothing() -> None:
    (container,) = pod_spec("pytorchjob", "--snapshot-size", "3Gi", "--memory", "1Gi")["containers"]
    assert container["resources"]["requests"]["memory"] == f"{1024 + 6144}Mi"
    spec = pod_spec("pytorchjob", "--snapshot-size", "0", "--memory", "1Gi", "--shm-size", "2Gi")
    assert spec["containers"][0]["resources"]["requests"]["memory"] == "1Gi"
    assert shm(spec) == "2Gi"


def test_a_program_or_snapshots_off_reserve_nothing_unless_given() -> None:
    spec = pod_spec("pytorchjob", "--memory", "1Gi", "--script", "/app/train.py")
    assert spec["containers"][0]["resources"]["requests"]["memory"] == "1Gi"
    spec = pod_spec("pytorchjob", "--memory", "1Gi", "--set", "checkpoint.memory_snapshots=false")
    assert spec["containers"][0]["resources"]["requests"]["memory"] == "1Gi"
    spec = pod_spec(
        "pytorchjob", "--memory", "1Gi", "--script", "/app/t.py", "--snapshot-size", "1Gi"
    )
    assert spec["containers"][0]["resources"]["requests"]["memory"] == f"{1024 + 2048}Mi"


def test_a_limit_grows_too_and_the_qos_class_stays() -> None:
    snapshots = mib([])
    (guaranteed,) = pod_spec("pytorchjob", "--memory", "8Gi", "--memory-limit", "8Gi")["containers"]
    both = f"{8192 + snapshots}Mi"
    assert guaranteed["resources"]["requests"]["memory"] == both
    assert guaranteed["resources"]["limits"]["memory"] == both
    (limited,) = pod_spec("pytorchjob", "--memory-limit", "8Gi")["containers"]
    assert "memory" not in limited["resources"].get("requests", {}), "a limit alone is the request"
    assert limited["resources"]["limits"]["memory"] == both


def test_a_size_that_cannot_hold_the_state_is_refused_in_one_line() -> None:
    config = ["--set", "workload.n_embd=768", "--set", "workload.n_layer=12"]
    with pytest.raises(RenderError) as refused:
        pod_spec("pytorchjob", "--snapshot-size", "100Mi", *config)
    message = str(refused.value)
    assert message.startswith("--snapshot-size: memorySnapshots.size 100Mi cannot hold one ")
    assert "\n" not in message and f"({-(-mib(config[1::2]) // 2)}Mi:" in message
