"""Job-level cluster commands on top of `kube.Cluster`: submit, wait, delete (status:
tools/job_status.py; logs: tools/job_logs.py).

What differs between the kinds (resource, pod label, container, conditions, status fields)
comes from the kind's module in tools/kinds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from kubeddp.tools import k8s_names as names
from kubeddp.tools import trainjob_submit
from kubeddp.tools.job_lookup import NOT_FOUND, FoundJob
from kubeddp.tools.job_status import terminal_state
from kubeddp.tools.kinds import JobKind
from kubeddp.tools.kube import Cluster, KubeError
from kubeddp.tools.resources import (
    CONFIG_MAP,
    DEPLOYMENT,
    PERSISTENT_VOLUME_CLAIM,
    POD_MONITOR,
    SERVICE,
    SERVICE_ACCOUNT,
)


def submit(cluster: Cluster, docs: list[dict], dry_run: bool) -> Iterator[str]:
    """Create each object in turn (a TrainJob waits for Trainer to see its runtime): a line
    for each as it is made."""
    suffix = " (server dry run)" if dry_run else ""
    for index, doc in enumerate(docs):
        created, note = trainjob_submit.create(cluster, doc, dry_run, docs[:index])
        meta = _mapping(created.get("metadata")) or _mapping(doc.get("metadata"))
        namespace = meta.get("namespace") or cluster.namespace
        line = f"{doc['kind'].lower()}/{meta.get('name')} created in {namespace}{suffix}"
        yield f"{line}; {note}" if note else line


def _mapping(value: object) -> dict:
    """A field of the API's answer that should be an object ({} when it is not)."""
    return value if isinstance(value, dict) else {}


def wait(
    cluster: Cluster, found: FoundJob, name: str, timeout_s: float, interval_s: float
) -> tuple[str | None, str]:
    """Poll until the job Succeeded or Failed: (that state, or None after `timeout_s`; the
    line that says so)."""
    kind, job = found.kind, found.job
    deadline = time.monotonic() + timeout_s
    while True:
        state = terminal_state(kind, job)
        if state:
            return state, f"{kind.resource.kind} {cluster.namespace}/{name}: {state}"
        if time.monotonic() >= deadline:
            return None, (
                f"{kind.resource.kind} {cluster.namespace}/{name}: still running after "
                f"{timeout_s:g}s (kubeddp status {name} shows why)"
            )
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))
        job = cluster.get(kind.resource, name)


def delete(cluster: Cluster, kind: JobKind, name: str, delete_pvc: bool) -> Iterator[str]:
    """The job, then what `kubeddp render` made for it; a missing companion is not an error.
    A line for each object as it is deleted."""
    cluster.delete(kind.resource, name)
    yield f"{kind.resource.kind.lower()}/{name} deleted"
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
            yield f"{resource.kind.lower()}/{companion} deleted"


@contextlib.contextmanager
def _unless_missing() -> Iterator[None]:
    """A companion that was never made, or whose API the cluster lacks, is not an error."""
    try:
        yield
    except KubeError as exc:
        if exc.status != NOT_FOUND:
            raise
