"""What `kubeddp status` shows of a job's health per pod, and `kubeddp diagnose`'s reports.

Read with the permissions `kubeddp status` and `kubeddp logs` already need (get/list pods,
get pods/log), nothing more: the pods' logs (the last LOG_TAIL lines, with the API server's
timestamps) carry the progress lines, the straggler and non-finite lines and the stall
report; a container that ended after a stall leaves the stall line as its termination
message (pod status). See docs/diagnostics.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubeddp.tools.cluster.terminal_text import printable
from kubeddp.trainer.launcher.stall_watch import (
    PROGRESS_LINE,
    REPORT_BEGIN,
    REPORT_END,
    STALL_LINE,
)

if TYPE_CHECKING:
    from kubeddp.tools.manifests.kinds import JobKind

LOG_TAIL = 400
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?Z (.*)$")
_STEP = re.compile(r"^step\s+(\d+)/(\d+) \|")
_STRAGGLER = re.compile(
    r"\[kubeddp\] straggler: rank (\d+) \(pod ([^,)]+)[^)]*?(, GPU [\w-]+)?\) works ([\d.]+)x"
)
_NOT_STRAGGLER = re.compile(r"\[kubeddp\] rank (\d+) is no longer a straggler")
_NONFINITE = re.compile(r"\[kubeddp\] (non-finite .* on rank \d+[^:]*)")


@dataclass
class PodHealth:
    step: str = ""  # "120/500" from the progress lines (rank 0's pod)
    last_line_at: str = ""  # the API server's timestamp of the pod's latest log line
    stall: str = ""  # the stall line (log or termination message)
    stragglers: dict[str, str] = field(default_factory=dict)  # pod -> "rank 5 (2.1x, GPU G)"
    nonfinite: str = ""
    ranks: str = ""  # the launch's latest progress line: each local rank's step and phase
    ranks_at: str = ""


def read_log(text: str) -> PodHealth:
    """The health lines of one pod's log (lines prefixed with the API server's timestamps)."""
    health = PodHealth()
    for raw in text.splitlines():
        stamped = _STAMP.match(raw)
        line = stamped.group(2) if stamped else raw
        if stamped:
            health.last_line_at = stamped.group(1) + "Z"
        if m := _STEP.match(line):
            health.step = f"{m.group(1)}/{m.group(2)}"
        elif line.startswith(PROGRESS_LINE):
            health.ranks = line[len(PROGRESS_LINE) :]
            health.ranks_at = stamped.group(1) + "Z" if stamped else ""
        elif line.startswith(STALL_LINE) and ("has been in" in line or "no progress" in line):
            health.stall = line[len(STALL_LINE) :]
        elif m := _STRAGGLER.search(line):  # the GPU: the label its health panels know it by
            health.stragglers[m.group(2)] = f"rank {m.group(1)} ({m.group(4)}x{m.group(3) or ''})"
        elif m := _NOT_STRAGGLER.search(line):
            health.stragglers = {
                p: v for p, v in health.stragglers.items() if not v.startswith(f"rank {m[1]} ")
            }
        elif m := _NONFINITE.search(line):
            health.nonfinite = m.group(1)
    return health


def termination_message(pod: dict) -> str:
    """The stall line a container left as its termination message (current or last run)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in ("state", "lastState"):
            ended = ((status or {}).get(state) or {}).get("terminated") or {}
            message = str(ended.get("message") or "")
            if message.startswith(STALL_LINE):
                return message[len(STALL_LINE) :].strip()
    return ""


def pod_logs(cluster: Any, pods: list[str], container: str, tail: int | None) -> dict[str, str]:
    """Each pod's log, timestamped; a pod whose log cannot be read maps to an error line."""
    from kubeddp.tools.cluster.kube import KubeError, object_path
    from kubeddp.tools.manifests.resources import POD

    logs = {}
    for pod in pods:
        query: list[tuple[str, Any]] = [("container", container), ("timestamps", "true")]
        if tail is not None:
            query.append(("tailLines", tail))
        path = f"{object_path(POD, cluster.namespace, pod)}/log"
        try:
            logs[pod] = cluster.request("GET", path, query, what="pods/log")
        except KubeError as exc:
            logs[pod] = f"!{exc}"
    return logs


def health_lines(pods: list[dict], logs: dict[str, str]) -> dict[str, list[str]]:
    """Pod name -> the lines `kubeddp status` prints under it."""
    read = {name: read_log(text) for name, text in logs.items() if not text.startswith("!")}
    stragglers: dict[str, str] = {}
    for health in read.values():
        stragglers.update(health.stragglers)
    out: dict[str, list[str]] = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        lines = []
        text = logs.get(name, "")
        if text.startswith("!"):
            lines.append(f"health: unknown (log not readable: {text[1:]})")
        health = read.get(name, PodHealth())
        progress = [f"step {health.step}"] if health.step else []
        if health.last_line_at:
            progress.append(f"last log line {health.last_line_at}")
        if progress:
            lines.append(", ".join(progress))
        if health.ranks:
            at = f" (at {health.ranks_at})" if health.ranks_at else ""
            lines.append(f"ranks: {health.ranks}{at}")
        if name in stragglers:
            lines.append(f"straggler: {stragglers[name]}")
        stall = health.stall or termination_message(pod)
        if stall:
            lines.append(f"stall: {stall}")
        if health.nonfinite:
            lines.append(health.nonfinite)
        out[name] = lines
    return out


def reports(text: str) -> list[str]:
    """The stall reports in a log, whole (timestamps removed)."""
    found, current = [], None
    for raw in text.splitlines():
        stamped = _STAMP.match(raw)
        line = stamped.group(2) if stamped else raw
        if line == REPORT_BEGIN:
            current = []
        elif line == REPORT_END and current is not None:
            found.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return found


def stall_reports(cluster: Any, kind: JobKind, name: str, say: Callable[[str], None]) -> list[str]:
    """Every stall report in the job's pod logs (or a container's termination message), each
    headed by its pod; `say` gets a line for each pod whose log cannot be read."""
    pods = cluster.list_pods(f"{kind.job_name_label}={name}")
    logs = pod_logs(cluster, [p["metadata"]["name"] for p in pods], kind.container, None)
    found = []
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        text = logs[pod_name]
        if text.startswith("!"):
            say(f"kubeddp diagnose: {pod_name}: log not readable: {text[1:]}")
            continue
        found += [f"==== {pod_name} ====\n{printable(report)}\n" for report in reports(text)]
        if not reports(text) and termination_message(pod):
            stall = printable(termination_message(pod))
            found.append(f"==== {pod_name} (termination message) ====\nstall: {stall}\n")
    return found
