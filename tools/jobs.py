"""Job-level cluster commands on top of `kube.Cluster`: submit, status, logs, wait, delete.

What differs between the kinds (resource, pod label, container, conditions, status fields)
comes from the kind's module in tools/kinds.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

import yaml

from kubeddp.tools import k8s_names as names
from kubeddp.tools import trainjob_submit
from kubeddp.tools.kinds import KINDS, JobKind
from kubeddp.tools.kube import Cluster, KubeError, object_path
from kubeddp.tools.kube_errors import StreamBroken
from kubeddp.tools.resources import (
    CONFIG_MAP,
    DEPLOYMENT,
    PERSISTENT_VOLUME_CLAIM,
    POD,
    POD_MONITOR,
    SERVICE,
    SERVICE_ACCOUNT,
)
from kubeddp.trainer import exit_codes

EXIT_SUCCEEDED = exit_codes.OK
EXIT_FAILED = exit_codes.TRAINING_FAILED  # the job failed
EXIT_TIMEOUT = exit_codes.WAIT_TIMEOUT


def submit(cluster: Cluster, docs: list[dict], dry_run: bool, out: TextIO) -> None:
    """Create each object in turn (a TrainJob waits for Trainer to see its runtime)."""
    suffix = " (server dry run)" if dry_run else ""
    for index, doc in enumerate(docs):
        created, note = trainjob_submit.create(cluster, doc, dry_run, docs[:index])
        meta = _mapping(created.get("metadata")) or _mapping(doc.get("metadata"))
        namespace = meta.get("namespace") or cluster.namespace
        line = f"{doc['kind'].lower()}/{meta.get('name')} created in {namespace}{suffix}"
        print(f"{line}; {note}" if note else line, file=out)


def _mapping(value: object) -> dict:
    """A field of the API's answer that should be an object ({} when it is not)."""
    return value if isinstance(value, dict) else {}


def _conditions(job: dict) -> list[dict]:
    conditions = _mapping(job.get("status")).get("conditions")
    return [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []


@contextlib.contextmanager
def _reading_answer(what: str) -> Iterator[None]:
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
    for condition in _conditions(job):
        if condition.get("status") != "True":
            continue
        if condition.get("type") in kind.success_conditions:
            return "Succeeded"
        if condition.get("type") == "Failed":
            return "Failed"
    return None


def status_report(cluster: Cluster, kind_name: str, name: str) -> dict[str, Any]:
    """What `status` shows, as data (`status -o json|yaml` prints it as it is)."""
    kind = KINDS[kind_name]
    job = cluster.get(kind.resource, name)
    job_status = _mapping(job.get("status"))
    conditions = [
        {key: condition.get(key) or "" for key in ("type", "status", "reason", "message")}
        for condition in _conditions(job)
    ]
    with _reading_answer(f"{kind.resource.kind} {name}"):
        replicas = [line.strip() for line in kind.replica_lines(job_status)]
    pods = []
    listed = cluster.list_pods(f"{kind.job_name_label}={name}")
    health = _health(cluster, kind, listed)
    for pod in listed:
        with _reading_answer(f"pod {pod['metadata']['name']}"):
            pod_status = _mapping(pod.get("status"))
            statuses = pod_status.get("containerStatuses") or []
            pods.append(
                {
                    "name": pod["metadata"]["name"],
                    "phase": pod_status.get("phase", "?"),
                    "restarts": sum(int(_mapping(s).get("restartCount", 0)) for s in statuses),
                    "node": _mapping(pod.get("spec")).get("nodeName", "-"),
                    "ends": [end for s in statuses if (end := termination_line(_mapping(s)))],
                    "health": health.get(pod["metadata"]["name"], []),
                }
            )
    return {
        "kind": kind.resource.kind,
        "namespace": cluster.namespace,
        "name": name,
        "state": terminal_state(kind, job) or "Running",
        "conditions": conditions,
        "replicas": replicas,
        "pods": pods,
    }


def status(cluster: Cluster, kind_name: str, name: str, out: TextIO, output: str = "text") -> None:
    report = status_report(cluster, kind_name, name)
    if output == "json":
        out.write(json.dumps(report, indent=2) + "\n")
        return
    if output == "yaml":
        out.write(yaml.safe_dump(report, sort_keys=False))
        return
    print(f"{report['kind']} {report['namespace']}/{name}: {report['state']}", file=out)
    print("conditions:", file=out)
    for c in report["conditions"]:
        line = f"  {c['type']}={c['status']} {c['reason']}: {c['message']}"
        print(line.rstrip(), file=out)
    print("replicas:", file=out)
    for line in report["replicas"]:
        print(f"  {line}", file=out)
    print("pods:", file=out)
    for pod in report["pods"]:
        print(
            f"  {pod['name']}: {pod['phase']}, restarts={pod['restarts']}, node={pod['node']}",
            file=out,
        )
        for line in [*pod["ends"], *pod["health"]]:
            print(f"    {line}", file=out)


def _health(cluster: Cluster, kind: JobKind, pods: list[dict]) -> dict[str, list[str]]:
    """Per pod: progress, straggler, stall and non-finite verdicts (tools/diagnosis.py)."""
    from kubeddp.tools import diagnosis

    names = [p["metadata"]["name"] for p in pods]
    logs = diagnosis.pod_logs(cluster, names, kind.container, diagnosis.LOG_TAIL)
    return diagnosis.health_lines(pods, logs)


def termination_line(container_status: dict) -> str:
    """`exit 5: <message>` of the container's current or last end (the one line launch wrote
    to its termination message, or the log tail FallbackToLogsOnError put there)."""
    for key in ("state", "lastState"):
        ended = _mapping(_mapping(container_status.get(key)).get("terminated"))
        if ended and ended.get("exitCode", 0) != 0:
            message = " ".join(str(ended.get("message") or ended.get("reason") or "").split())
            return (
                f"{'ended' if key == 'state' else 'last ended'} exit {ended.get('exitCode')}: "
                + (message[-300:] or "(no message)")
            )
    return ""


def wait(
    cluster: Cluster, kind_name: str, name: str, timeout_s: float, interval_s: float, out: TextIO
) -> int:
    kind = KINDS[kind_name]
    deadline = time.monotonic() + timeout_s
    while True:
        state = terminal_state(kind, cluster.get(kind.resource, name))
        if state:
            print(f"{kind.resource.kind} {cluster.namespace}/{name}: {state}", file=out)
            return EXIT_SUCCEEDED if state == "Succeeded" else EXIT_FAILED
        if time.monotonic() >= deadline:
            print(
                f"{kind.resource.kind} {cluster.namespace}/{name}: still running after "
                f"{timeout_s:g}s (kubeddp status {name} shows why)",
                file=out,
            )
            return EXIT_TIMEOUT
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))


def _selector(kind: JobKind, name: str, replica: str | None) -> str:
    selector = f"{kind.job_name_label}={name}"
    return selector if replica is None else f"{selector},{kind.replica_selector(replica)}"


def logs(
    cluster: Cluster,
    kind_name: str,
    name: str,
    replica: str | None,
    follow: bool,
    tail_lines: int | None,
    out: TextIO,
) -> None:
    kind = KINDS[kind_name]
    pods = [p["metadata"]["name"] for p in cluster.list_pods(_selector(kind, name, replica))]
    if not pods:
        raise KubeError(
            f"no pods of {kind.resource.kind} {name!r} in namespace "
            f"{cluster.namespace!r} yet; check kubeddp status {name}"
        )
    if not follow:
        for pod in pods:
            for line in cluster.pod_log(pod, kind.container, tail_lines).splitlines():
                print(f"[{pod}] {line}", file=out)
        return
    lock = threading.Lock()
    errors: list[str] = []

    def pump(pod: str) -> None:
        query: list[tuple[str, object]] = [("container", kind.container), ("follow", "true")]
        if tail_lines is not None:
            query.append(("tailLines", tail_lines))
        try:
            response = cluster.stream(f"{object_path(POD, cluster.namespace, pod)}/log", query)
            for raw in response:
                for line in raw.decode(errors="replace").splitlines():
                    with lock:
                        print(f"[{pod}] {line}", file=out, flush=True)
        except KubeError as exc:
            errors.append(str(exc))
        except StreamBroken as exc:  # the stream broke off
            errors.append(f"the log stream of pod {pod} broke off ({exc})")

    threads = [threading.Thread(target=pump, args=(pod,), daemon=True) for pod in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise KubeError(errors[0])


def delete(cluster: Cluster, kind_name: str, name: str, delete_pvc: bool, out: TextIO) -> None:
    """The job, then what `kubeddp render` made for it; a missing companion is not an error."""
    kind = KINDS[kind_name]
    cluster.delete(kind.resource, name)
    print(f"{kind.resource.kind.lower()}/{name} deleted", file=out)
    companions = [(CONFIG_MAP, f"{name}-config"), (POD_MONITOR, name)]
    companions += [(resource, name) for resource in kind.companions]
    companions += [(DEPLOYMENT, f"{name}-keeper"), (SERVICE, f"{name}-keeper")]  # keeper
    if delete_pvc:
        companions.append((PERSISTENT_VOLUME_CLAIM, f"{name}-checkpoints"))
    # --create-service-account may name it anything: find it by the labels render gives it.
    made_by_render = f"{names.LABEL_INSTANCE}={name},{names.LABEL_MANAGED_BY}={names.APP_NAME}"
    with _unless_missing():
        accounts = cluster.list_objects(SERVICE_ACCOUNT, made_by_render)
        companions += [(SERVICE_ACCOUNT, account["metadata"]["name"]) for account in accounts]
    for resource, companion in companions:
        with _unless_missing():
            cluster.delete(resource, companion)
            print(f"{resource.kind.lower()}/{companion} deleted", file=out)


@contextlib.contextmanager
def _unless_missing() -> Iterator[None]:
    """A companion that was never made, or whose API the cluster lacks, is not an error."""
    try:
        yield
    except KubeError as exc:
        if "not found" not in str(exc) and "has no" not in str(exc):
            raise
