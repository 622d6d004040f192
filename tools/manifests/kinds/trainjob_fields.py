"""What a TrainJob lets kubeddp set on its pods, read from the Trainer v2.3 TrainJob CRD.

Every kind's pod is written once, by templates/_pod.tpl. A TrainJob has no pod template: the
chart splits that pod (templates/_trainjob.tpl) by this table. The training container's fields
that `spec.trainer` has (by name, or as NAMEPerNode: resources -> resourcesPerNode) go there;
the pod's metadata and spec fields and the container's fields that `runtimePatches` admits go
into the patch; anything else is left to the runtime, and kinds/trainjob.py refuses the chart
values that would write it. `make chart` writes the table into the chart's _constants.tpl from
the bundled schema (tools/manifests/schemas, itself made from tests/reference/crds), so a Trainer
version that admits more takes more, with no hand-written list to update.
"""

from __future__ import annotations

import functools
from typing import Any

from kubeddp.tools.manifests import bundled_schemas

TRAINJOB = "trainer.kubeflow.org/v1alpha1/TrainJob"
CONTAINER = "io.k8s.api.core.v1.Container"
PER_NODE = "PerNode"  # spec.trainer.resourcesPerNode: the container's resources on every node
# From spec.runtimePatches[] down to the pod template of a replicated job.
POD_PATH = (
    "items", "trainingRuntimeSpec", "template", "spec", "replicatedJobs", "items", "template",
    "spec", "template",
)  # fmt: skip
# Written by the chart's template itself, not from the pod: the container's name, and the
# containers list the training container is one entry of.
STRUCTURE = {"containers", "name"}


def _properties(node: dict[str, Any]) -> dict[str, Any]:
    return node.get("properties") or {}


def _at(node: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path:
        node = node["items"] if key == "items" else _properties(node)[key]
    return node


@functools.cache
def split_table() -> dict[str, Any]:
    """{metadata, spec, container: field names the patch admits; trainer: container field ->
    spec.trainer field}, sorted."""
    spec = _properties(_properties(bundled_schemas.crd_schema(TRAINJOB))["spec"])
    pod = _properties(_at(spec["runtimePatches"], POD_PATH))
    trainer = _properties(spec["trainer"])
    to_trainer = {}
    for field in _properties(bundled_schemas.core_definition(CONTAINER)):
        for name in (field, field + PER_NODE):
            if name in trainer:
                to_trainer[field] = name
                break
    patched = _properties(_at(pod["spec"], ("containers", "items")))
    return {
        "metadata": sorted(_properties(pod["metadata"])),
        "spec": sorted(set(_properties(pod["spec"])) - STRUCTURE),
        "container": sorted(set(patched) - STRUCTURE - set(to_trainer)),
        "trainer": dict(sorted(to_trainer.items())),
    }


@functools.cache
def admitted() -> frozenset[str]:
    """The pod fields a TrainJob carries, as `metadata.X`, `spec.X` or `container.X` (the
    training container's), the form tools/manifests/kinds/values.py POD_FIELDS names them in."""
    table = split_table()
    return frozenset(
        f"{part}.{field}"
        for part, fields in (
            ("metadata", table["metadata"]),
            ("spec", table["spec"]),
            ("container", [*table["container"], *table["trainer"]]),
        )
        for field in fields
    )
