"""What an API server holds and admits, for the tests of the ways a job reaches a cluster (Helm,
kubectl apply, `kubeddp submit`): objects created, updated and deleted by name, and Kubeflow
Trainer v2.3's TrainJob validating webhook.

The webhook (kubeflow/trainer v2.3.0): pkg/webhooks/trainjob_webhook.go registers
`validator.trainjob.trainer.kubeflow.org` (failurePolicy=fail) on create and update, and calls
the runtime's ValidateObjects (pkg/runtime/core/trainingruntime.go, clustertrainingruntime.go):
a Get of the runtime that spec.runtimeRef names through the manager's client, which reads the
controller's informer cache; not found is a field.Invalid on spec.runtimeRef ending
"specified trainingRuntime must be created before the TrainJob is created". controller-runtime
answers a denial with 403 Forbidden, and the API server prefixes the webhook's name.

The informer cache lags behind the API server: here an object is seen by the webhook `lag`
requests after the one that created it (every request is a tick of the server's clock), so
`lag=0` sees it at the next request, and a client that creates a TrainJob right after its
runtime is refused while lag >= 1. The CRD defaults runtimeRef's apiGroup and kind
(ClusterTrainingRuntime). A server dry run (`dryRun=All`) runs admission and persists nothing.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

import yaml

from tests.helpers import reference

GROUP = "trainer.kubeflow.org"
WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
CLUSTER_SCOPED = frozenset({"ClusterTrainingRuntime"})
RUNTIME_KINDS = {  # kind -> how Trainer's message names it
    "TrainingRuntime": "trainingRuntime",
    "ClusterTrainingRuntime": "clusterTrainingRuntime",
}
DEFAULT_RUNTIME_KIND = "ClusterTrainingRuntime"  # the CRD's default for runtimeRef.kind
TRAINER_KINDS = frozenset({"TrainJob", *RUNTIME_KINDS})


class Refused(Exception):
    """The API server's error answer: HTTP code, Status reason and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def runtime_refusal(runtime_ref: dict, namespace: str) -> Refused:
    """Trainer's answer when its cache has no such runtime, as the API server passes it on."""
    kind = runtime_ref.get("kind") or DEFAULT_RUNTIME_KIND
    name = runtime_ref.get("name")
    ref = {"name": name, "apiGroup": runtime_ref.get("apiGroup") or GROUP, "kind": kind}
    message = (
        f'admission webhook "{WEBHOOK}" denied the request: spec.runtimeRef: Invalid value: '
        f'{json.dumps(ref, separators=(",", ":"))}: {kind}.{GROUP} "{name}" not found: '
        f"specified {RUNTIME_KINDS.get(kind, kind)} must be created before the TrainJob is created"
    )
    return Refused(403, "Forbidden", message)


Key = tuple[str, str, str]  # (kind, namespace or "" when cluster-scoped, name)


@dataclass
class Stored:
    doc: dict
    created: int  # the tick of the request that created it
    deleted: int | None = None


@dataclass
class ApiObjects:
    """The objects of one cluster and the requests that changed them (method, kind, name,
    outcome), in order; `lag` is how many requests the webhook's cache runs behind."""

    lag: int = 0
    namespace: str = "default"
    objects: dict[Key, Stored] = field(default_factory=dict)
    log: list[tuple[str, str, str, str]] = field(default_factory=list)
    tick: int = 0

    def key(self, doc: dict) -> Key:
        meta = doc.get("metadata") or {}
        kind = doc["kind"]
        namespace = "" if kind in CLUSTER_SCOPED else meta.get("namespace") or self.namespace
        return kind, namespace, meta["name"]

    def exists(self, doc: dict) -> bool:
        stored = self.objects.get(self.key(doc))
        return stored is not None and stored.deleted is None

    def get(self, doc: dict) -> dict | None:
        """A GET (a request: the clock moves): the object as stored, None when absent."""
        self.tick += 1
        stored = self.objects.get(self.key(doc))
        return None if stored is None or stored.deleted is not None else stored.doc

    def later(self) -> None:
        """Time passes with no request: the webhook's cache catches up."""
        self.tick += self.lag + 1

    def seed(self, doc: dict) -> None:
        """An object the cluster had long before (an operator's default runtime)."""
        self.objects[self.key(doc)] = Stored(copy.deepcopy(doc), created=-(10**9))

    def _cache_sees(self, key: Key) -> bool:
        stored = self.objects.get(key)
        if stored is None or stored.created + self.lag >= self.tick:
            return False
        return stored.deleted is None or stored.deleted + self.lag >= self.tick

    def _admit(self, doc: dict) -> None:
        if doc.get("kind") != "TrainJob":
            return
        ref = (doc.get("spec") or {}).get("runtimeRef") or {}
        kind = ref.get("kind") or DEFAULT_RUNTIME_KIND
        namespace = "" if kind in CLUSTER_SCOPED else self.key(doc)[1]
        if kind not in RUNTIME_KINDS or not self._cache_sees((kind, namespace, ref.get("name"))):
            raise runtime_refusal(ref, self.key(doc)[1])

    def _record(self, method: str, doc: dict, outcome: str) -> None:
        self.log.append((method, doc["kind"], self.key(doc)[2], outcome))

    def create(self, doc: dict, dry_run: bool = False) -> dict:
        self.tick += 1
        key = self.key(doc)
        try:
            if self.exists(doc):
                raise Refused(409, "AlreadyExists", f'{key[0]} "{key[2]}" already exists')
            self._admit(doc)
        except Refused as exc:
            self._record("create", doc, exc.reason)
            raise
        self._record("create", doc, "dry-run" if dry_run else "created")
        if not dry_run:
            self.objects[key] = Stored(copy.deepcopy(doc), created=self.tick)
        return doc

    def update(self, doc: dict) -> dict:
        self.tick += 1
        key = self.key(doc)
        try:
            if not self.exists(doc):
                raise Refused(404, "NotFound", f'{key[0]} "{key[2]}" not found')
            self._admit(doc)
        except Refused as exc:
            self._record("update", doc, exc.reason)
            raise
        self._record("update", doc, "updated")
        self.objects[key].doc = copy.deepcopy(doc)
        return doc

    def delete(self, doc: dict) -> None:
        self.tick += 1
        stored = self.objects.get(self.key(doc))
        if stored is not None and stored.deleted is None:
            stored.deleted = self.tick
        self._record("delete", doc, "deleted" if stored else "NotFound")

    def live(self) -> list[dict]:
        """The objects that exist now, those seeded aside, in the order they were created."""
        stored = [s for s in self.objects.values() if s.deleted is None and s.created >= 0]
        return [copy.deepcopy(s.doc) for s in sorted(stored, key=lambda s: s.created)]

    def created_kinds(self) -> list[str]:
        """The kinds of the objects created, in the order they were created."""
        return [kind for method, kind, _, outcome in self.log if outcome == "created"]


TORCH_RUNTIME = "clustertrainingruntime_torch-distributed.v2.3.0.yaml"


def with_trainer(lag: int = 0, namespace: str = "default") -> ApiObjects:
    """A cluster with Trainer v2.3 installed: its torch-distributed runtime, long there."""
    api = ApiObjects(lag=lag, namespace=namespace)
    api.seed(yaml.safe_load(reference.require(reference.CRDS / TORCH_RUNTIME).read_text()))
    return api
