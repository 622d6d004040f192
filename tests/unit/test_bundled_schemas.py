"""The schemas shipped in tools/manifests/schemas are what tools/generate/schemas.py makes from
their sources, and they judge manifests as their sources do: the core kinds as kubernetes-validate,
the Kubeflow kinds as the pinned CRDs (tests/reference)."""

from __future__ import annotations

import copy
import functools

import kubernetes_validate
import pytest

from kubeddp.tools.generate import schemas as gen_schemas
from kubeddp.tools.manifests import bundled_schemas, schema_checks
from kubeddp.tools.manifests.bundled_schemas import KUBERNETES_SCHEMA_VERSION
from tests.helpers.render import render_job

pytestmark = pytest.mark.timeout(120)
JOBS = (
    ("pytorchjob", "--nodes", "2", "--podmonitor", "--checkpoint-size", "1Gi"),
    ("trainjob",),
    ("indexedjob", "--nodes", "2"),
)


@functools.cache
def rendered() -> list[dict]:
    """Every document of JOBS (rendered when a test needs them, not at collection: every
    pytest-xdist process collects every module)."""
    return [doc for job in JOBS for doc in render_job(*job)]


def core_docs() -> list[dict]:
    return [d for d in rendered() if f"{d['apiVersion']}/{d['kind']}" in bundled_schemas.CORE_KINDS]


def test_generated_files_are_fresh() -> None:
    for path, text in gen_schemas.generated().items():
        assert path.read_text() == text, f"{path.name} is stale; run `make chart`"


def test_every_rendered_core_kind_is_bundled() -> None:
    kinds = {f"{d['apiVersion']}/{d['kind']}" for d in rendered()}
    custom = {"monitoring.coreos.com/v1/PodMonitor", *bundled_schemas.CRD_FILES}
    assert kinds - custom <= set(bundled_schemas.CORE_KINDS)
    assert {"v1/ConfigMap", "v1/Service", "batch/v1/Job"} <= kinds


def _upstream(doc: dict) -> bool:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError:
        return False
    return True


def _broken(doc: dict) -> list[dict]:
    """Unknown field at the top and in metadata, a wrong type deep in a pod spec."""
    top = {**copy.deepcopy(doc), "spek": {}}
    meta = copy.deepcopy(doc)
    meta["metadata"]["labelz"] = {}
    out = [top, meta]
    if doc["kind"] == "Job":
        deep = copy.deepcopy(doc)
        deep["spec"]["template"]["spec"]["containers"][0]["ports"] = "8080"
        out.append(deep)
    return out


def test_core_kinds_judged_as_kubernetes_validate_does() -> None:
    docs = core_docs()
    assert len(docs) >= 5
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        assert schema_checks.core_issues(doc) == [] and _upstream(doc), name
        for bad in _broken(doc):
            assert schema_checks.core_issues(bad) and not _upstream(bad), name


@pytest.mark.parametrize("key", sorted(bundled_schemas.CRD_FILES))
def test_kubeflow_kinds_checked_against_the_bundled_crd(key: str) -> None:
    (job,) = [d for d in rendered() if f"{d['apiVersion']}/{d['kind']}" == key]
    schema = bundled_schemas.crd_schema(key)
    assert schema_checks.crd_issues(job, schema) == []
    bad = {**copy.deepcopy(job), "spec": {**job["spec"], "runPolicyy": {}}}
    assert [path for path, _ in schema_checks.crd_issues(bad, schema)] == ["spec.runPolicyy"]
