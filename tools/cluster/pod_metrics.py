"""What `kubeddp status` reads from the job's pods' /metrics: progress, ETA and loss; the
transport NCCL chose and the network check.

The endpoint is reached through the API server's pod proxy
(`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/metrics`, RBAC `get pods/proxy`, in
k8s/rbac.yaml), so it works from wherever `kubectl` works, with no port-forward. The port is
the pod's container port named `metrics` (the chart's `metrics.port`), else kubeddp's default.

Adding a line: one function `PodMetrics -> str | None` appended to POD_LINES; status prints
its line under each running pod whose /metrics it read (None: no line for that pod).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubeddp.tools.cluster.kube import Cluster, KubeError, object_path
from kubeddp.tools.manifests import k8s_names as names
from kubeddp.tools.manifests.resources import POD
from kubeddp.trainer import constants
from kubeddp.trainer.worker.netcheck_plan import rate, size_text

READ_SECONDS = 5  # one pod's /metrics; a pod that does not answer is named, not waited for
PARALLEL_READS = 8
Sample = tuple[str, dict[str, str], float]  # sample name, labels, value


@dataclass(frozen=True)
class PodMetrics:
    pod: str
    samples: tuple[Sample, ...] = ()

    def values(self, name: str) -> list[float]:
        return [value for sample, _, value in self.samples if sample == name]

    def value(self, name: str) -> float | None:
        found = self.values(name)
        return found[0] if found and math.isfinite(found[0]) else None


@dataclass
class MetricsRead:
    """Each running pod's /metrics, or why it could not be read."""

    pods: dict[str, PodMetrics] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)  # pod -> why (one line)


def parse(pod: str, text: str) -> PodMetrics:
    """The samples of Prometheus' text format (prometheus_client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
    return PodMetrics(pod, tuple(samples))


def metrics_port(pod: dict, container: str) -> int:
    for entry in (pod.get("spec") or {}).get("containers") or []:
        if isinstance(entry, dict) and entry.get("name") == container:
            for port in entry.get("ports") or []:
                if isinstance(port, dict) and port.get("name") == names.METRICS_PORT_NAME:
                    number = port.get("containerPort")
                    if isinstance(number, int) and 0 < number < 65536:
                        return number
    return constants.METRICS_PORT


def _read_one(cluster: Cluster, pod: dict, container: str) -> PodMetrics | str:
    name = pod["metadata"]["name"]
    port = metrics_port(pod, container)
    path = f"{object_path(POD, cluster.namespace, name)}:{port}/proxy{names.METRICS_PATH}"
    try:
        text = cluster.with_timeout(READ_SECONDS).request("GET", path, what="pods/proxy", text=True)
    except KubeError as exc:
        if exc.status == 404:
            return f"nothing serves /metrics on port {port} (metrics.enabled=false?)"
        if exc.status in (502, 503):
            return f"the API server's pod proxy cannot reach port {port} (still starting?)"
        return str(exc)
    try:
        return parse(name, text)
    except (ValueError, TypeError) as exc:
        return f"port {port} answers no Prometheus metrics ({str(exc)[:80]})"


def read_pods(cluster: Cluster, pods: list[dict], container: str) -> MetricsRead:
    """/metrics of the running pods, read side by side (each within READ_SECONDS)."""
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    read = MetricsRead()
    if not running:
        return read
    with ThreadPoolExecutor(min(PARALLEL_READS, len(running))) as pool:
        answers = list(pool.map(lambda pod: _read_one(cluster, pod, container), running))
    for pod, answer in zip(running, answers, strict=True):
        if isinstance(answer, PodMetrics):
            read.pods[pod["metadata"]["name"]] = answer
        else:
            read.unread[pod["metadata"]["name"]] = answer
    return read


# ---- what is shown ----------------------------------------------------------------------


def fmt_seconds(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress(metrics: PodMetrics) -> dict[str, Any] | None:
    """Step, planned steps, percent, ETA and loss of one pod (None before its first step). The
    ETA is the steps left times the mean step time of the pod's ranks."""
    step = metrics.value("kubeddp_step")
    if step is None:
        return None
    planned = metrics.value("kubeddp_planned_steps") or None
    seconds = sum(metrics.values("kubeddp_step_duration_seconds_sum"))
    count = sum(metrics.values("kubeddp_step_duration_seconds_count"))
    per_step = seconds / count if count else None
    out: dict[str, Any] = {"step": int(step), "planned_steps": int(planned) if planned else None}
    out["percent"] = round(min(100.0, 100.0 * step / planned), 1) if planned else None
    out["eta_seconds"] = (
        round(per_step * max(0.0, planned - step)) if planned and per_step is not None else None
    )
    out["loss"] = metrics.value("kubeddp_loss")
    return out


def progress_text(found: dict[str, Any]) -> str:
    step = f"step {found['step']}"
    if found["planned_steps"]:
        step += f"/{found['planned_steps']} ({found['percent']:g}%)"
    parts = [step]
    if found["eta_seconds"] is not None:
        parts.append(f"eta {fmt_seconds(found['eta_seconds'])}")
    if found["loss"] is not None:
        parts.append(f"loss {found['loss']:.4f}")
    return ", ".join(parts)


def _pod_progress_line(metrics: PodMetrics) -> str | None:
    found = progress(metrics)
    return f"metrics: {progress_text(found)}" if found else None


def _pod_network_line(metrics: PodMetrics) -> str | None:
    """The transport NCCL chose (kubeddp_info's labels; empty on gloo) and, on rank 0's pod,
    the latest network check: its largest all-reduce and the slowest node pair."""
    parts = []
    info = next((labels for name, labels, _ in metrics.samples if name == "kubeddp_info"), {})
    if info.get("transport"):
        where = info.get("transport_interfaces", "")
        inside = info.get("intra_node_transport", "")
        parts.append(
            f"transport {info['transport']}" + (f" ({where})" if where else "")
            + (f", {inside} inside the node" if inside else "")
        )  # fmt: skip
    bus = {
        int(labels["message_bytes"]): value
        for name, labels, value in metrics.samples
        if name == "kubeddp_network_bus_bandwidth_bytes_per_second" and "message_bytes" in labels
    }
    if bus:
        size = max(bus)
        parts.append(f"check: all-reduce bus bandwidth {rate(bus[size])} at {size_text(size)}")
    for name, labels, value in metrics.samples:
        if name == "kubeddp_network_slowest_link_bandwidth_bytes_per_second":
            pair = f"{labels.get('pod_a')} ({labels.get('node_a')}) <-> {labels.get('pod_b')} "
            pair += f"({labels.get('node_b')})"
            slow = metrics.values("kubeddp_network_slow_link_ratio")  # only while it is slow
            verdict = f", {slow[0]:.1f}x below the median (slow link)" if slow else ""
            parts.append(f"slowest node pair {pair} {rate(value)}{verdict}")
    return "network: " + "; ".join(parts) if parts else None


# Lines under each pod, from its own /metrics.
POD_LINES: list[Callable[[PodMetrics], str | None]] = [_pod_progress_line, _pod_network_line]


def job_progress(read: MetricsRead) -> dict[str, Any] | None:
    """The job's progress: that of the pod furthest along (rank 0's pod has the loss)."""
    best = None
    for metrics in read.pods.values():
        found = progress(metrics)
        if found and (best is None or found["step"] > best["step"]):
            best = {**found, "pod": metrics.pod}
    return best


def unread_line(read: MetricsRead) -> str:
    """One line naming the pods whose /metrics could not be read, and why."""
    if not read.unread:
        return ""
    reasons: dict[str, list[str]] = {}
    for pod, why in read.unread.items():
        reasons.setdefault(why, []).append(pod)
    why, pods = max(reasons.items(), key=lambda item: len(item[1]))
    shown = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
    more = f" ({len(reasons) - 1} other reason(s))" if len(reasons) > 1 else ""
    return f"/metrics not read from {shown}: {why}{more}"
