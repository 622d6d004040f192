"""NVIDIA dcgm-exporter's /metrics as it serves them (tests/unit/dcgm/NODE.prom, one exporter a
node) and the series Prometheus stores from them, for promtool's rule and expression tests.

The job in them: pod demo-kubeddp-worker-0 on node gpu-a (ranks 0 and 1), demo-kubeddp-worker-1
on gpu-b (ranks 2 and 3); gpu-b's third GPU belongs to another job's pod.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

DCGM_DIR = Path(__file__).resolve().parents[1] / "unit" / "dcgm"
NS = "team"
KUBEDDP_JOB = f"{NS}/demo-kubeddp"  # the PodMonitor's job label: <namespace>/<name>
# rank -> (pod, node, UUID of its GPU), as kubeddp_rank_info says
RANKS = {
    "0": ("demo-kubeddp-worker-0", "gpu-a", "GPU-3f1c2a9e-7b41-4c1d-9e2a-51d0c8a7b601"),
    "1": ("demo-kubeddp-worker-0", "gpu-a", "GPU-8d2e6b13-0a5c-4f7e-b3d9-2c4e7f9a1b02"),
    "2": ("demo-kubeddp-worker-1", "gpu-b", "GPU-a7c93d42-5e18-4b6f-8c01-9d3f2e6b4c03"),
    "3": ("demo-kubeddp-worker-1", "gpu-b", "GPU-1b5f8e27-c936-4d0a-a7e4-6f2b8d1c9e04"),
}
RANK_LABELS = {
    rank: {"pod": pod, "node": node, "UUID": uuid} for rank, (pod, node, uuid) in RANKS.items()
}
OTHER_JOBS_GPU = "GPU-e94a0c6d-2f73-4a8b-9d15-3c7e1b5a0f05"
# DCGM's older name of field 112, which dcgm-exporter's counters CSV still takes (go-dcgm keeps
# it as an alias of DCGM_FI_DEV_CLOCKS_EVENT_REASONS); the series is named as the CSV names it.
ALIASES = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}
XID = "DCGM_FI_DEV_XID_ERRORS"
MINUTES = 60
Sample = tuple[str, dict[str, str], float]


def recorded() -> dict[str, list[Sample]]:
    """Node -> the samples its exporter serves (prometheus_client's text parser), named as
    served: the parser adds `_total` to a counter's samples that lack it (OpenMetrics' naming),
    which Prometheus does not."""
    out = {}
    for path in sorted(DCGM_DIR.glob("*.prom")):
        text = path.read_text()
        out[path.stem] = [
            (_as_served(f, s.name, text), dict(s.labels), s.value)
            for f in text_string_to_metric_families(text)
            for s in f.samples
        ]
    return out


def _as_served(family: Metric, sample: str, text: str) -> str:
    if family.type == "counter" and f"# TYPE {sample} counter" not in text:
        return family.name
    return sample


def names() -> set[str]:
    return {name for samples in recorded().values() for name, _, _ in samples}


def stored(node: str, labels: dict[str, str]) -> dict[str, str]:
    """The labels Prometheus stores for an exporter's sample when a ServiceMonitor with
    honorLabels false scrapes it (dcgm-exporter's and the GPU Operator's default): the target's
    own namespace/pod/container win, the exporter's become exported_*."""
    out = {k: v for k, v in labels.items() if k not in ("namespace", "pod", "container")}
    out.update(
        {f"exported_{k}": labels[k] for k in ("namespace", "pod", "container") if k in labels}
    )
    out.update(
        job="nvidia-dcgm-exporter", namespace="gpu-operator", container="nvidia-dcgm-exporter",
        pod=f"nvidia-dcgm-exporter-{node}", instance=f"{node}:9400",
    )  # fmt: skip
    return out


def series_text(name: str, labels: dict[str, str]) -> str:
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{shown}}}"


def rank_info_series(minutes: int) -> list[dict]:
    """kubeddp_rank_info of the job's ranks as the PodMonitor stores it."""
    out = []
    for rank, (pod, node, uuid) in RANKS.items():
        labels = {"job": KUBEDDP_JOB, "namespace": NS, "pod": pod, "container": "pytorch",
                  "rank": rank, "local_rank": str(int(rank) % 2), "node": node,
                  "UUID": uuid}  # fmt: skip
        out.append({"series": series_text("kubeddp_rank_info", labels), "values": f"1x{minutes}"})
    return out


def exporter_series(minutes: int, changes: dict[tuple[str, str], str]) -> list[dict]:
    """promtool input series for every recorded sample: its recorded value every minute, or
    the values `changes` gives for (metric name, GPU UUID)."""
    out = []
    for node, samples in recorded().items():
        for name, labels, value in samples:
            values = changes.get((name, labels.get("UUID", "")), f"{value:g}x{minutes}")
            out.append({"series": series_text(name, stored(node, labels)), "values": values})
    return out


def _xid(uuid: str, node: str, at: int, code: str, text: str) -> dict:
    """An XID at minute `at`: the exporter's err_code="0" series ends, one with the code begins."""
    (labels,) = [lab for name, lab, _ in recorded()[node] if name == XID and lab["UUID"] == uuid]
    new = stored(node, {**labels, "err_code": code, "err_msg": text})
    return {"series": series_text(XID, new), "values": f"_x{at} {code}x{MINUTES - at}"}


def incident_series() -> list[dict]:
    """An hour of the job's kubeddp_rank_info and every exporter's series (one sample a minute),
    with these incidents:
    - minute 5-14: rank 2's GPU is power capped (clock event reasons 4);
    - minute 10: another job's GPU on gpu-b reports XID 13;
    - minute 20: rank 3's GPU reports XID 79 (fallen off the bus);
    - minute 30: rank 1's GPU counts 2 uncorrectable (double-bit) ECC errors, rank 0's 5
      corrected (single-bit) ones;
    - minute 40 on: rank 2's GPU is slowed down by HW thermal and HW slowdown (64 + 8);
    - minute 50: rank 0's GPU counts 3 NVLink CRC data errors.
    """
    gpu = {rank: labels["UUID"] for rank, labels in RANK_LABELS.items()}
    changes = {
        (XID, gpu["3"]): "0x19 stale",
        (XID, OTHER_JOBS_GPU): "0x9 stale",
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu["1"]): "0x29 2x30",
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu["0"]): "0x29 5x30",
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu["2"]): "0x4 4x9 0x24 72x20",
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", gpu["0"]): "0x49 3x10",
    }
    return [
        *rank_info_series(MINUTES),
        *exporter_series(MINUTES, changes),
        _xid(gpu["3"], "gpu-b", 20, "79", "GPU has fallen off the bus"),
        _xid(OTHER_JOBS_GPU, "gpu-b", 10, "13", "Graphics Engine Exception"),
    ]
