"""Job-level cluster commands on top of `kube.Cluster`: submit, wait, delete (status:
tools/cluster/job_status.py; logs: tools/cluster/job_logs.py).

What differs between the kinds (resource, pod label, container, conditions, status fields)
comes from the kind's module in tools/manifests/kinds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from kubeddp.tools.cluster import submit_order, trainjob_submit
from kubeddp.tools.cluster.job_lookup import NOT_FOUND, FoundJob
from kubeddp.tools.cluster.job_status import terminal_state
from kubeddp.tools.cluster.kube import Cluster, KubeError
from kubeddp.tools.manifests import k8s_names as names
from kubeddp.tools.manifests.kinds import JobKind
from kubeddp.tools.manifests.resources import (
    CONFIG_MAP,
    DEPLOYMENT,
    NETWORK_POLICY,
    PERSISTENT_VOLUME_CLAIM,
    POD_MONITOR,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
)


def submit(cluster: Cluster, docs: list[dict], dry_run: bool) -> Iterator[str]:
    """Create each object in turn: what the job needs first, the job, then the rest owned by
    it (tools/cluster/submit_order.py; a TrainJob waits for Trainer to see its runtime). A line for
    each as it is made."""
    before, job, after = submit_order.in_order(docs)
    if job is not None:
        submit_order.refuse_existing(cluster, after)
    made: list[dict] = []
    owner = None
    for doc in [*before, *([job] if job is not None else [])]:
        created, note = trainjob_submit.create(cluster, doc, dry_run, made)
        made.append(doc)
        if doc is job:
            owner = submit_order.owner_reference(created)
        yield _line(cluster, doc, created, "created", note, dry_run)
    for doc in after:
        owned = submit_order.owned_by(doc, owner)
        note = f"owned by {job['kind'].lower()}/{owner['name']}" if owned is not doc else ""
        if submit_order.is_keeper_secret(doc):
            created, kept = submit_order.create_or_keep_secret(cluster, owned, dry_run)
            if kept:
                yield _line(cluster, doc, created, "kept", submit_order.KEPT, dry_run)
                continue
        else:
            created = cluster.create(owned, dry_run=dry_run)
        yield _line(cluster, doc, created, "created", note, dry_run)


def _line(cluster: Cluster, doc: dict, created: dict, verb: str, note: str, dry_run: bool) -> str:
    meta = _mapping(created.get("metadata")) or _mapping(doc.get("metadata"))
    namespace = meta.get("namespace") or cluster.namespace
    suffix = " (server dry run)" if dry_run else ""
    line = f"{doc['kind'].lower()}/{meta.get('name')} {verb} in {namespace}{suffix}"
    return f"{line}; {note}" if note else line


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
    """The job, then what `kubeddp render` made for it (what submit made the job own goes with
    it anyway; a job applied with kubectl owns nothing); a missing companion is not an error.
    A line for each object as it is deleted."""
    cluster.delete(kind.resource, name)
    yield f"{kind.resource.kind.lower()}/{name} deleted"
    companions = [(CONFIG_MAP, f"{name}-config"), (POD_MONITOR, name)]
    companions += [(resource, name) for resource in kind.companions]
    keeper = f"{name}{names.KEEPER_SUFFIX}"  # the checkpoint keeper, its secret, its policy
    companions += [(DEPLOYMENT, keeper), (SERVICE, keeper), (NETWORK_POLICY, keeper)]
    companions.append((SECRET, f"{name}{names.KEEPER_TOKEN_SUFFIX}"))
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
