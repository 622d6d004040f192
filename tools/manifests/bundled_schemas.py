"""The schemas shipped with kubeddp (tools/manifests/schemas/, made by tools/generate/schemas.py):
strict core kinds at one Kubernetes version, and the PyTorchJob and TrainJob CRDs at the operator
versions kubeddp targets. Offline validation reads these; no download, no 100 MiB dependency."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
KUBERNETES_SCHEMA_VERSION = "1.37.0"
CORE_FILE = f"core-v{KUBERNETES_SCHEMA_VERSION}.json"
# apiVersion/kind -> kubernetes-validate's file: what kubeddp renders, k8s/ holds, or checks
# inside a job (PodTemplate).
CORE_KINDS = {
    "v1/ConfigMap": "configmap-v1.json",
    "v1/PersistentVolumeClaim": "persistentvolumeclaim-v1.json",
    "v1/Pod": "pod-v1.json",
    "v1/PodTemplate": "podtemplate-v1.json",
    "v1/Service": "service-v1.json",
    "v1/ServiceAccount": "serviceaccount-v1.json",
    "batch/v1/Job": "job-batch-v1.json",
    "rbac.authorization.k8s.io/v1/Role": "role-rbac-v1.json",
    "rbac.authorization.k8s.io/v1/RoleBinding": "rolebinding-rbac-v1.json",
    "apps/v1/Deployment": "deployment-apps-v1.json",  # the checkpoint keeper
    "v1/Secret": "secret-v1.json",  # its secret
    "networking.k8s.io/v1/NetworkPolicy": "networkpolicy-networking-v1.json",  # who reaches it
}
# apiVersion/kind -> (bundled file, file under tests/reference/crds, served version)
CRD_FILES = {
    "kubeflow.org/v1/PyTorchJob": (
        "pytorchjob-v1.9.4.json",
        "kubeflow.org_pytorchjobs.v1.9.4.yaml",
        "v1",
    ),
    "trainer.kubeflow.org/v1alpha1/TrainJob": (
        "trainjob-v2.3.0.json",
        "trainer.kubeflow.org_trainjobs.v2.3.0.yaml",
        "v1alpha1",
    ),
    "trainer.kubeflow.org/v1alpha1/TrainingRuntime": (  # the gang runtime beside a TrainJob
        "trainingruntime-v2.3.0.json",
        "trainer.kubeflow.org_trainingruntimes.v2.3.0.yaml",
        "v1alpha1",
    ),
}


@functools.cache
def _core() -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / CORE_FILE).read_text())


@functools.cache
def core_validator(key: str) -> Any | None:
    """A jsonschema validator for a core apiVersion/kind, or None when it is not bundled."""
    # jsonschema, the `cli` extra: optional (`kubeddp --help` imports this module)
    import jsonschema

    core = _core()
    if key not in core["kinds"]:
        return None
    return jsonschema.Draft202012Validator({**core["kinds"][key], "$defs": core["$defs"]})


def core_definition(name: str) -> dict[str, Any]:
    """A definition of the bundled core schemas, e.g. io.k8s.api.core.v1.Container."""
    return _core()["$defs"][name]


@functools.cache
def crd_schema(key: str) -> dict[str, Any]:
    """The bundled openAPIV3Schema of a Kubeflow kind (apiVersion/kind)."""
    return json.loads((SCHEMA_DIR / CRD_FILES[key][0]).read_text())["openAPIV3Schema"]
