"""`kubeddp status`: a job's state, conditions, replica counts and pods, with each pod's health
(from its log, tools/cluster/diagnosis.py) and progress (from its /metrics,
tools/cluster/pod_metrics.py), and a TrainJob's `status.trainerStatus` when its pods post one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kubeddp.tools.cluster import pod_metrics
from kubeddp.tools.cluster.job_lookup import FoundJob
from kubeddp.tools.cluster.kube import Cluster, KubeError
from kubeddp.tools.cluster.terminal_text import printable
from kubeddp.tools.manifests.kinds import JobKind


def mapping(value: object) -> dict:
    """A field of the API's answer that should be an object ({} when it is not)."""
    return value if isinstance(value, dict) else {}


def conditions_of(job: dict) -> list[dict]:
    conditions = mapping(job.get("status")).get("conditions")
    return [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []


@contextlib.contextmanager
def reading_answer(what: str) -> Iterator[None]:
    """An answer of an unexpected shape (an old operator, a proxy) is the cluster's problem:
    one line naming what was read, not a traceback."""
    try:
        yield
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise KubeError(
            f"the API server's answer for {what} has an unexpected shape "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); check the operator's "
            "version (kubeddp status reads status.conditions and the replica counts)"
        ) from None


def terminal_state(kind: JobKind, job: dict) -> str | None:
    """'Succeeded', 'Failed' or None (still running), from the conditions."""
    for condition in conditions_of(job):
        if condition.get("status") != "True":
            continue
        if condition.get("type") in kind.success_conditions:
            return "Succeeded"
        if condition.get("type") == "Failed":
            return "Failed"
    return None


def termination_line(container_status: dict) -> str:
    """`exit 5: <message>` of the container's current or last end (the one line launch wrote
    to its termination message, or the log tail FallbackToLogsOnError put there)."""
    for key in ("state", "lastState"):
        ended = mapping(mapping(container_status.get(key)).get("terminated"))
        if ended and ended.get("exitCode", 0) != 0:
            message = " ".join(
                printable(str(ended.get("message") or ended.get("reason") or "")).split()
            )
            return (
                f"{'ended' if key == 'state' else 'last ended'} exit {ended.get('exitCode')}: "
                + (message[-300:] or "(no message)")
            )
    return ""


def trainer_status(job: dict) -> dict[str, Any] | None:
    """A TrainJob's status.trainerStatus (posted by its rank-0 pod through Trainer's progress
    endpoint), as Trainer v2.3's CRD defines it; None when there is none."""
    found = mapping(job.get("status")).get("trainerStatus")
    if not isinstance(found, dict):
        return None
    metrics = found.get("metrics") if isinstance(found.get("metrics"), list) else []
    return {
        "progress_percent": _number(found.get("progressPercentage")),
        "eta_seconds": _number(found.get("estimatedRemainingSeconds")),
        "metrics": {
            printable(str(m.get("name"))): printable(str(m.get("value")))
            for m in metrics
            if isinstance(m, dict)
        },
        "updated": printable(str(found.get("lastUpdatedTime") or "")),
    }


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pods(cluster: Cluster, kind: JobKind, name: str) -> tuple[list[dict], pod_metrics.MetricsRead]:
    """The job's pods as listed, and as `status` shows them (health and metrics lines)."""
    # 60 modules, only for `status`: `kubeddp --help` imports this module
    from kubeddp.tools.cluster import diagnosis

    listed = cluster.list_pods(f"{kind.job_name_label}={name}")
    pod_names = [p["metadata"]["name"] for p in listed]
    health = diagnosis.health_lines(
        listed, diagnosis.pod_logs(cluster, pod_names, kind.container, diagnosis.LOG_TAIL)
    )
    read = pod_metrics.read_pods(cluster, listed, kind.container)
    shown = []
    for pod in listed:
        pod_name = pod["metadata"]["name"]
        with reading_answer(f"pod {pod_name}"):
            pod_status = mapping(pod.get("status"))
            statuses = pod_status.get("containerStatuses") or []
            metrics = read.pods.get(pod_name)
            shown.append(
                {
                    "name": pod_name,
                    "phase": pod_status.get("phase", "?"),
                    "restarts": sum(int(mapping(s).get("restartCount", 0)) for s in statuses),
                    "node": mapping(pod.get("spec")).get("nodeName", "-"),
                    "ends": [end for s in statuses if (end := termination_line(mapping(s)))],
                    "health": [printable(line) for line in health.get(pod_name, [])],
                    "metrics": [
                        line
                        for read_line in pod_metrics.POD_LINES
                        if metrics and (line := read_line(metrics))
                    ],
                }
            )
    return shown, read


def status_report(cluster: Cluster, found: FoundJob, name: str) -> dict[str, Any]:
    """What `status` shows, as data (`status -o json|yaml` prints it as it is)."""
    kind, job = found.kind, found.job
    conditions = [
        {
            key: printable(str(condition.get(key) or ""))
            for key in ("type", "status", "reason", "message")
        }
        for condition in conditions_of(job)
    ]
    with reading_answer(f"{kind.resource.kind} {name}"):
        replicas = [line.strip() for line in kind.replica_lines(mapping(job.get("status")))]
    pods, read = _pods(cluster, kind, name)
    running = [p for p in pods if p["phase"] == "Running"]
    return {
        "kind": kind.resource.kind,
        "namespace": cluster.namespace,
        "name": name,
        "state": terminal_state(kind, job) or "Running",
        "conditions": conditions,
        "replicas": replicas,
        "progress": pod_metrics.job_progress(read),
        "metrics_unread": pod_metrics.unread_line(read)
        or ("" if running or not pods else "no running pod to read /metrics from"),
        "trainer_status": trainer_status(job),
        "pods": pods,
    }


def status_lines(report: dict[str, Any]) -> list[str]:
    """The text form of `status_report`."""
    lines = [f"{report['kind']} {report['namespace']}/{report['name']}: {report['state']}"]
    progress = report.get("progress")
    if progress:
        lines.append(
            f"progress: {pod_metrics.progress_text(progress)} (/metrics of {progress['pod']})"
        )
    if report.get("metrics_unread"):
        lines.append(f"progress: {report['metrics_unread']}")
    lines += _trainer_status_lines(report.get("trainer_status"))
    lines.append("conditions:")
    for c in report["conditions"]:
        lines.append(f"  {c['type']}={c['status']} {c['reason']}: {c['message']}".rstrip())
    lines.append("replicas:")
    lines += [f"  {line}" for line in report["replicas"]]
    lines.append("pods:")
    for pod in report["pods"]:
        lines.append(
            f"  {pod['name']}: {pod['phase']}, restarts={pod['restarts']}, node={pod['node']}"
        )
        lines += [f"    {line}" for line in [*pod["ends"], *pod["health"], *pod["metrics"]]]
    return lines


def _trainer_status_lines(found: dict[str, Any] | None) -> list[str]:
    if not found:
        return []
    parts = []
    if found["progress_percent"] is not None:
        parts.append(f"{found['progress_percent']}%")
    if found["eta_seconds"] is not None:
        parts.append(f"eta {pod_metrics.fmt_seconds(found['eta_seconds'])}")
    parts += [f"{key} {value}" for key, value in found["metrics"].items()]
    when = f" (updated {found['updated']})" if found["updated"] else ""
    return [f"trainer status: {', '.join(parts) or 'posted, empty'}{when}"]
