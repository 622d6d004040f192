"""What `kubeddp submit` creates in which order, and what the job owns.

First what the job's admission needs (its ServiceAccount: a pod that names a missing one is
refused; a TrainJob's own runtime: Trainer's webhook refuses a TrainJob before it), then the
job, then everything else with an ownerReference to the job's uid: deleting the job (kubectl
delete, a TTL, `kubeddp delete`) makes the API server's garbage collector delete its keeper's
Deployment, Service, Secret and NetworkPolicy, its ConfigMap and its PodMonitor too. The
checkpoint claim is never owned: it outlives the job unless `kubeddp delete --delete-pvc`. A
pod that starts before its ConfigMap or Secret exists waits for the kubelet to mount it.

What comes after the job is looked for before the job is made: one that exists already (left
by an earlier job of this name that nothing owned) is refused as its create would be, before the
job could start with it. The job's keeper Secret is created only when absent: one that exists
and belongs to no job (made by hand, or by an earlier `kubectl apply`) holds the value the
running keeper and pods read, and is kept; one an earlier job owns goes with that job, so it is
refused. Its value is never read into a line: only its metadata is looked at.
"""

from __future__ import annotations

import copy

from kubeddp.tools.cluster.kube import Cluster, resource_for
from kubeddp.tools.cluster.kube_errors import KubeError
from kubeddp.tools.manifests import k8s_names as names
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.resources import (
    PERSISTENT_VOLUME_CLAIM,
    SECRET,
    SERVICE_ACCOUNT,
    TRAINING_RUNTIME,
)

BEFORE_JOB = (SERVICE_ACCOUNT.key, TRAINING_RUNTIME.key)
NEVER_OWNED = (PERSISTENT_VOLUME_CLAIM.key,)
JOB_KEYS = tuple(kind.resource.key for kind in KINDS.values())
CONFLICT = 409
NOT_FOUND = 404
KEEPER_COMPONENT = "checkpoint-keeper"


def key_of(doc: dict) -> str:
    return f"{doc.get('apiVersion')}/{doc.get('kind')}"


def in_order(docs: list[dict]) -> tuple[list[dict], dict | None, list[dict]]:
    """(what the job needs first, the job, the rest) in the order given; no job, or several
    (a file may hold anything): (every document, None, [])."""
    jobs = [doc for doc in docs if key_of(doc) in JOB_KEYS]
    if len(jobs) != 1:
        return list(docs), None, []
    (job,) = jobs
    before = [doc for doc in docs if key_of(doc) in BEFORE_JOB]
    after = [doc for doc in docs if doc is not job and key_of(doc) not in BEFORE_JOB]
    return before, job, after


def refuse_existing(cluster: Cluster, after: list[dict]) -> None:
    """KubeError (409, as the create would answer) for the first object of `after` that
    exists; the keeper's Secret is kept unless an earlier job owns it."""
    for doc in after:
        resource, name = resource_for(doc), str((doc.get("metadata") or {}).get("name"))
        try:
            found = cluster.get(resource, name)
        except KubeError as exc:
            if exc.status == NOT_FOUND:
                continue
            raise
        if is_keeper_secret(doc):
            _refuse_a_departing_secret(name, found.get("metadata") or {})
            continue
        raise KubeError(
            f"{resource.full_name} {name!r} already exists in namespace "
            f"{(doc.get('metadata') or {}).get('namespace') or cluster.namespace!r}; delete it "
            "first (kubeddp delete NAME) or pick another --name",
            CONFLICT,
        )


def owner_reference(job: dict) -> dict | None:
    """The reference to the created job (None when its answer has no uid: a dry run may not)."""
    meta = job.get("metadata") if isinstance(job.get("metadata"), dict) else {}
    if not meta.get("uid") or not meta.get("name"):
        return None
    return {
        "apiVersion": job.get("apiVersion"),
        "kind": job.get("kind"),
        "name": meta["name"],
        "uid": meta["uid"],
    }


def owned_by(doc: dict, owner: dict | None) -> dict:
    """`doc` as the job's (the claim never is)."""
    if owner is None or key_of(doc) in NEVER_OWNED:
        return doc
    owned = copy.deepcopy(doc)
    meta = owned.setdefault("metadata", {})
    meta["ownerReferences"] = [*(meta.get("ownerReferences") or []), owner]
    return owned


def is_keeper_secret(doc: dict) -> bool:
    labels = (doc.get("metadata") or {}).get("labels") or {}
    return key_of(doc) == SECRET.key and labels.get(names.LABEL_COMPONENT) == KEEPER_COMPONENT


KEPT = "it exists already, and the job's keeper and pods read its value"


def create_or_keep_secret(cluster: Cluster, doc: dict, dry_run: bool) -> tuple[dict, bool]:
    """Create the keeper's Secret, or keep the one that exists: (the answer, whether kept)."""
    try:
        return cluster.create(doc, dry_run=dry_run), False
    except KubeError as exc:
        if exc.status != CONFLICT:
            raise
    name = str(doc["metadata"]["name"])
    found = cluster.get(SECRET, name).get("metadata") or {}
    _refuse_a_departing_secret(name, found)
    return {"metadata": found}, True


def _refuse_a_departing_secret(name: str, meta: dict) -> None:
    """A Secret an earlier job owns goes with that job: keeping it would leave the new pods
    without their secret."""
    if meta.get("deletionTimestamp") or meta.get("ownerReferences"):
        raise KubeError(
            f"secret {name!r} already exists and belongs to an earlier job of this name, which "
            f"is being deleted; submit again once it is gone (kubectl get secret {name})",
            CONFLICT,
        )
