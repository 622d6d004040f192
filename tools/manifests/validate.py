"""Validate manifest documents: schema (strict) plus the operators' webhook rules.

`validate_documents(docs, crd_schemas)` returns one `Problem` per finding. Kubeflow kinds are
checked against `crd_schemas` (the CRDs read from the cluster, keyed by `apiVersion/kind`) when
given, else against the published Kubeflow SDK models; core kinds against the Kubernetes OpenAPI
schemas. `kubeddp render` and `kubeddp submit` call this before printing or sending anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeddp.tools.manifests import schema_checks
from kubeddp.tools.manifests.kinds import BY_RESOURCE
from kubeddp.tools.manifests.resources import POD_MONITOR
from kubeddp.trainer import yaml_io

# Files that sit beside manifests but are never sent to the API server.
NOT_CLUSTER_OBJECTS = ("kustomize.config.k8s.io/",)
TRAINING_RUNTIME_KEY = "trainer.kubeflow.org/v1alpha1/TrainingRuntime"  # beside a TrainJob


@dataclass(frozen=True)
class Problem:
    source: str  # file name (or "render")
    kind: str
    name: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}{self.kind}/{self.name}: {self.path}: {self.message}"


class ManifestError(ValueError):
    """The input is not a list of Kubernetes objects at all (YAML syntax, not a mapping)."""


def load_documents(text: str, source: str) -> list[dict]:
    try:
        docs = yaml_io.load_all(text, source)
    except yaml_io.YamlInputError as exc:
        raise ManifestError(str(exc)) from None
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ManifestError(
                f"{source}: document {index + 1} is a {type(doc).__name__}, not a Kubernetes object"
            )
    return docs


def _key(doc: dict) -> str:
    return f"{doc.get('apiVersion')}/{doc.get('kind')}"


def _podmonitor_issues(doc: dict) -> list[tuple[str, str]]:
    """Offline: the PodMonitor CRD is not bundled anywhere, so check the fields that matter."""
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    issues = []
    if not isinstance(spec.get("selector"), dict):
        issues.append(("spec.selector", "is missing; select the job's pods by label"))
    endpoints = spec.get("podMetricsEndpoints")
    if not isinstance(endpoints, list) or not endpoints:
        issues.append(("spec.podMetricsEndpoints", "is missing; add one with port: metrics"))
    else:
        for index, endpoint in enumerate(endpoints):
            # Without a port the endpoint scrapes every declared port; relabelings must then
            # pick the target and address (what the TrainJob PodMonitor does).
            if not isinstance(endpoint, dict) or not (
                {"port", "targetPort", "portNumber", "relabelings"} & set(endpoint)
            ):
                issues.append(
                    (
                        f"spec.podMetricsEndpoints[{index}]",
                        "needs port (a name), portNumber, targetPort or relabelings",
                    )
                )
    return issues


def document_issues(doc: dict, crd_schemas: dict[str, dict]) -> list[tuple[str, str]]:
    key = _key(doc)
    if not doc.get("apiVersion") or not doc.get("kind"):
        return [("(document)", "apiVersion and kind are required")]
    if not isinstance(doc["apiVersion"], str) or not isinstance(doc["kind"], str):
        return [("(document)", "apiVersion and kind must be strings")]
    if "metadata" in doc and not isinstance(doc["metadata"], dict):
        return [("metadata", f"must be a mapping, got {type(doc['metadata']).__name__}")]
    if key.startswith(NOT_CLUSTER_OBJECTS):
        return []
    kind = BY_RESOURCE.get(key)
    if key in crd_schemas:
        issues = schema_checks.crd_issues(doc, crd_schemas[key])
    elif kind and kind.schema_issues:
        issues = kind.schema_issues(doc)
    elif key == POD_MONITOR.key:
        issues = _podmonitor_issues(doc)
    elif key == TRAINING_RUNTIME_KEY:
        issues = schema_checks.trainingruntime_issues(doc)
    else:
        try:
            issues = schema_checks.core_issues(doc)
        except schema_checks.SchemaUnavailable:
            return [
                (
                    "(document)",
                    f"no schema known for {key}; kubeddp validates core kinds, "
                    "PyTorchJob, TrainJob, TrainingRuntime and PodMonitor",
                )
            ]
    if kind:
        issues += kind.admission_issues(doc)
    first_per_path: dict[str, str] = {}  # the SDK walk and the pod schema may both see one
    for path, message in issues:
        first_per_path.setdefault(path, message)
    return list(first_per_path.items())


def validate_documents(
    docs: list[dict], source: str = "", crd_schemas: dict[str, dict] | None = None
) -> list[Problem]:
    problems = []
    for doc in docs:
        meta = doc.get("metadata")
        name = str(meta.get("name", "?")) if isinstance(meta, dict) else "?"
        if doc.get("apiVersion") == "v1" and doc.get("kind") == "List":
            items = doc.get("items") or []
            if not isinstance(items, list):
                message = f"must be a list of objects, got {type(items).__name__}"
                problems.append(Problem(source, "List", name, "items", message))
                continue
            for index, item in enumerate(items):
                if not isinstance(item, dict):
                    message = f"must be a Kubernetes object, got {type(item).__name__}"
                    problems.append(Problem(source, "List", name, f"items[{index}]", message))
            objects = [item for item in items if isinstance(item, dict)]
            problems += validate_documents(objects, source, crd_schemas)
            continue
        for path, message in document_issues(doc, crd_schemas or {}):
            problems.append(Problem(source, str(doc.get("kind", "?")), name, path, message))
    return problems


def document_warnings(docs: list[dict], source: str = "") -> list[Problem]:
    """What the operators accept but a locked-down cluster may reject (one line each)."""
    found = []
    for doc in docs:
        if doc.get("apiVersion") == "v1" and doc.get("kind") == "List":
            items = doc.get("items") if isinstance(doc.get("items"), list) else []
            found += document_warnings([i for i in items if isinstance(i, dict)], source)
            continue
        kind = BY_RESOURCE.get(_key(doc))
        if kind is None:
            continue
        meta = doc.get("metadata")
        name = str(meta.get("name", "?")) if isinstance(meta, dict) else "?"
        for path, message in kind.warnings(doc):
            found.append(Problem(source, str(doc.get("kind", "?")), name, path, message))
    return found
