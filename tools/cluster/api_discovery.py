"""Which job kinds the cluster serves, read from its API discovery as kubectl and Helm read it:
GET /apis (the API groups and their versions), then /apis/<group>/<version> (that version's
resources) for each operator's group the first answer lists. `kubeddp submit` without a KIND
runs the kind this picks, by the rule of the chart's `kind: auto` (tools/manifests/kinds).

A group/version is not enough: training-operator's kubeflow.org/v1 is also Kubeflow Notebooks'
group, so the resource itself (pytorchjobs, kind PyTorchJob) must be in the version's list.
"""

from __future__ import annotations

from typing import Any

from kubeddp.tools.cluster.kube import Cluster
from kubeddp.tools.cluster.kube_errors import KubeError
from kubeddp.tools.manifests.kinds import AUTO_ORDER, KINDS, JobKind, pick_kind
from kubeddp.tools.manifests.resources import Resource

GROUPS_PATH = "/apis"
NOT_FOUND = 404


def _not_believed(cluster: Cluster, path: str, what: str) -> KubeError:
    return KubeError(
        f"the API server at {cluster.host} answered GET {path} with {what}; nothing is "
        "believed from it: check that the kubeconfig's server is a Kubernetes API server, "
        "or name the kind (kubeddp submit pytorchjob|trainjob|indexedjob)"
    )


def _list_of(answer: dict, kind: str, key: str) -> list[dict] | None:
    if answer.get("kind") != kind or answer.get("apiVersion") != "v1":
        return None
    items = answer.get(key)
    if not isinstance(items, list):
        return None
    return [item for item in items if isinstance(item, dict)]


def served_group_versions(cluster: Cluster) -> set[str]:
    """Every group/version the API server lists at /apis (e.g. batch/v1)."""
    answer = cluster.request("GET", GROUPS_PATH, what="API discovery")
    groups = _list_of(answer, "APIGroupList", "groups")
    if groups is None:
        raise _not_believed(cluster, GROUPS_PATH, "something that is not an APIGroupList")
    found = set()
    for group in groups:
        versions = group.get("versions")
        for version in versions if isinstance(versions, list) else []:
            name = version.get("groupVersion") if isinstance(version, dict) else None
            if isinstance(name, str):
                found.add(name)
    return found


def serves(cluster: Cluster, resource: Resource, group_versions: set[str]) -> bool:
    """The resource is in its group/version's discovery list (the version must be listed)."""
    if resource.api_version not in group_versions:
        return False
    path = f"{GROUPS_PATH}/{resource.api_version}"
    try:
        answer: Any = cluster.request("GET", path, what="API discovery")
    except KubeError as exc:
        if exc.status == NOT_FOUND:  # removed since /apis answered (an operator uninstalled)
            return False
        raise
    resources = _list_of(answer, "APIResourceList", "resources")
    if resources is None or answer.get("groupVersion") != resource.api_version:
        raise _not_believed(cluster, path, f"something that is not {resource.api_version}'s list")
    return any(
        item.get("name") == resource.plural and item.get("kind") == resource.kind
        for item in resources
    )


def discovered_kind(cluster: Cluster) -> tuple[JobKind, str]:
    """The kind `kind: auto` stands for on this cluster, and one line that says why."""
    group_versions = served_group_versions(cluster)
    kind = pick_kind(lambda resource: serves(cluster, resource, group_versions))
    if kind.name == AUTO_ORDER[-1]:
        absent = " nor ".join(KINDS[name].resource.key for name in AUTO_ORDER[:-1])
        return kind, f"the cluster serves neither {absent}"
    return kind, f"the cluster serves {kind.resource.key}"
