"""The Role a user needs to run `kubeddp submit/status/logs/wait/delete` in one namespace.

Reading CRDs (for `--validate-against cluster`) is cluster-scoped and not granted here: without
it kubeddp validates offline against the Kubeflow SDK models.
"""

from __future__ import annotations

from kubeddp.tools.manifests import k8s_names as names
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.resources import APPLY_FIRST, APPLY_LAST, POD, Resource

ROLE_NAME = "kubeddp-submitter"
SUBMITTERS_GROUP = "kubeddp-submitters"  # bind your users or service accounts here
MANAGE = ["create", "get", "list", "watch", "delete"]
READ = ["get", "list", "watch"]


def _rules_by_group(resources: list[Resource], verbs: list[str]) -> list[dict]:
    """One rule per API group, its resources in the order given."""
    groups: dict[str, list[str]] = {}
    for resource in resources:
        groups.setdefault(resource.group, []).append(resource.plural)
    return [
        {"apiGroups": [group], "resources": plurals, "verbs": verbs}
        for group, plurals in groups.items()
    ]


# Everything `submit` creates (and `delete` removes): the job kinds and the objects beside them.
SUBMITTED = [kind.resource for kind in KINDS.values()] + [*APPLY_FIRST, *APPLY_LAST]
RULES = [
    *_rules_by_group(SUBMITTED, MANAGE),
    {"apiGroups": [""], "resources": [POD.plural], "verbs": READ},
    {"apiGroups": [""], "resources": [f"{POD.plural}/log"], "verbs": ["get"]},
    # `kubeddp status` reads each pod's /metrics through the API server's pod proxy. It reaches
    # any port of the namespace's pods: no more than creating the jobs already allows.
    {"apiGroups": [""], "resources": [f"{POD.plural}/proxy"], "verbs": ["get"]},
]


def _metadata(namespace: str | None) -> dict:
    meta: dict = {"name": ROLE_NAME}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {
        names.LABEL_NAME: names.APP_NAME,
        names.LABEL_MANAGED_BY: names.APP_NAME,
        names.LABEL_COMPONENT: "rbac",
    }
    return meta


def build_rbac(namespace: str | None = None) -> list[dict]:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(namespace),
        "rules": [dict(rule) for rule in RULES],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": SUBMITTERS_GROUP}
        ],
    }
    return [role, binding]
