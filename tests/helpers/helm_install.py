"""How Helm and kubectl send a chart's or a file's objects to the API server, in their order,
against `admission.ApiObjects` (which runs Trainer's TrainJob webhook).

Helm (helm/helm v3.16.1 and v3.18.0 pkg/releaseutil, v4.1.4 pkg/release/v1/util):
- SortManifests reads the rendered files by sorted path; an object annotated `helm.sh/hook` is
  a hook, the rest the release's manifests; both are sorted by kind (kind_sorter.go): the kinds
  of InstallOrder in its order, then every other kind alphabetically, stable within a kind;
- install (pkg/action/install.go performInstall): the pre-install hooks, then the manifests
  (Create: one kind after the other), then the post-install hooks; the first refused object
  ends the install (the release is then `failed`);
- a hook run (pkg/action/hooks.go execHook): hooks sorted by weight, then name; each is first
  deleted when its delete policy says before-hook-creation (the default), then created; a
  hook is kept out of the release: upgrades leave it unless it is also a pre-upgrade hook, and
  uninstall leaves it;
- upgrade (pkg/action/upgrade.go, also from a `failed` release): pre-upgrade hooks, then each
  manifest created when absent or updated when it differs, then post-upgrade hooks.

kubectl apply -f: each object in the file's order, created when absent or patched when it
differs; a refused object does not stop the others, and the command then exits 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

import yaml

from tests.helpers.admission import ApiObjects, Refused, with_trainer

# pkg/releaseutil/kind_sorter.go InstallOrder (the same in v3.16.1 and v3.18.0)
INSTALL_ORDER_3 = (
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
    "PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
    "ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
    "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
    "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
    "DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
    "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
    "APIService",
)  # fmt: skip
# v4.1.4 pkg/release/v1/util/kind_sorter.go: the webhook configurations come last
INSTALL_ORDER_4 = (
    *INSTALL_ORDER_3, "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"
)  # fmt: skip
HOOK = "helm.sh/hook"
HOOK_WEIGHT = "helm.sh/hook-weight"
HOOK_DELETE_POLICY = "helm.sh/hook-delete-policy"
BEFORE_HOOK_CREATION = "before-hook-creation"


class InstallFailed(Exception):
    """Helm stopped at a refused object: what the API server said."""

    def __init__(self, doc: dict, refused: Refused) -> None:
        name = (doc.get("metadata") or {}).get("name")
        super().__init__(f"{doc.get('kind')} {name}: {refused.message}")
        self.doc, self.refused = doc, refused


def install_order(helm_major: int) -> tuple[str, ...]:
    return INSTALL_ORDER_4 if helm_major >= 4 else INSTALL_ORDER_3


def sort_by_kind(docs: list[dict], helm_major: int = 3) -> list[dict]:
    """Helm's kind order: known kinds by their place, then the others alphabetically."""
    order = {kind: index for index, kind in enumerate(install_order(helm_major))}
    return sorted(docs, key=lambda d: (0, order[d["kind"]], "") if d["kind"] in order
                  else (1, 0, d["kind"]))  # fmt: skip


@dataclass
class Hook:
    doc: dict
    events: tuple[str, ...]
    weight: int
    delete_policies: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.doc["metadata"]["name"]


@dataclass
class Release:
    """A chart's rendered objects as Helm splits them: hooks and the release's manifests, each
    in Helm's order."""

    hooks: list[Hook] = field(default_factory=list)
    manifests: list[dict] = field(default_factory=list)


def _annotations(doc: dict) -> dict:
    return (doc.get("metadata") or {}).get("annotations") or {}


def split(rendered: dict[str, str], helm_major: int = 3) -> Release:
    """Rendered files (path -> text, as Helm's engine gives them) -> hooks and manifests."""
    hooks: list[Hook] = []
    manifests: list[dict] = []
    for path in sorted(rendered):
        if PurePosixPath(path).name.startswith("_") or not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(rendered[path]):
            if not doc:
                continue
            annotations = _annotations(doc)
            if HOOK not in annotations:
                manifests.append(doc)
                continue
            policies = annotations.get(HOOK_DELETE_POLICY, "")
            hooks.append(
                Hook(
                    doc,
                    tuple(e.strip().lower() for e in annotations[HOOK].split(",")),
                    int(annotations.get(HOOK_WEIGHT, "0")),
                    tuple(p.strip() for p in policies.split(",") if p.strip()),
                )
            )
    by_kind = {id(doc): i for i, doc in enumerate(sort_by_kind([h.doc for h in hooks], helm_major))}
    hooks.sort(key=lambda h: by_kind[id(h.doc)])
    return Release(hooks, sort_by_kind(manifests, helm_major))


def from_documents(docs: list[dict], helm_major: int = 3) -> Release:
    """The same from a stream of objects (one file, in the stream's order)."""
    return split({"templates/all.yaml": yaml.safe_dump_all(docs)}, helm_major)


def _create(api: ApiObjects, doc: dict) -> None:
    try:
        api.create(doc)
    except Refused as refused:
        raise InstallFailed(doc, refused) from None


def run_hooks(api: ApiObjects, release: Release, event: str) -> None:
    running = [h for h in release.hooks if event in h.events]
    running.sort(key=lambda h: (h.weight, h.name))  # stable: the kind order stays within ties
    for hook in running:
        if BEFORE_HOOK_CREATION in (hook.delete_policies or (BEFORE_HOOK_CREATION,)):
            api.delete(hook.doc)  # a DELETE either way (NotFound is ignored), then the wait
        _create(api, hook.doc)


def install(api: ApiObjects, release: Release) -> None:
    """`helm install`: InstallFailed at the first refused object."""
    run_hooks(api, release, "pre-install")
    for doc in release.manifests:
        _create(api, doc)
    run_hooks(api, release, "post-install")


def upgrade(api: ApiObjects, release: Release) -> None:
    """`helm upgrade` (also of a failed release): InstallFailed at the first refused object."""
    run_hooks(api, release, "pre-upgrade")
    for doc in release.manifests:
        current = api.get(doc)
        if current is None:
            _create(api, doc)
        elif current != doc:
            try:
                api.update(doc)
            except Refused as refused:
                raise InstallFailed(doc, refused) from None
    run_hooks(api, release, "post-upgrade")


def kubectl_apply(api: ApiObjects, docs: list[dict]) -> list[InstallFailed]:
    """`kubectl apply -f FILE`: every object in the file's order; the refusals."""
    failed = []
    for doc in docs:
        try:
            current = api.get(doc)
            if current is None:
                api.create(doc)
            elif current != doc:
                api.update(doc)
        except Refused as refused:
            failed.append(InstallFailed(doc, refused))
    return failed


def installed(rendered: dict[str, str], namespace: str = "default") -> list[dict]:
    """What `helm install` leaves in a cluster with Trainer (InstallFailed when refused)."""
    api = with_trainer(namespace=namespace)
    install(api, split(rendered))
    return api.live()


def applied(docs: list[dict], namespace: str = "default") -> list[dict]:
    """What one `kubectl apply -f` of `docs` leaves in a cluster with Trainer (the first
    refusal raised)."""
    api = with_trainer(namespace=namespace)
    for failed in kubectl_apply(api, docs):
        raise failed
    return api.live()
