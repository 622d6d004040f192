"""Every chart value, for every kind, either lands in the kind's objects where its `takes`
table (tools/manifests/kinds/<kind>.py) says, or is refused with one line, or (another kind's
section) changes nothing. A value added to tools/manifests/chart/values.py that a kind's table
forgets fails here."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import pytest

from kubeddp.tools.manifests.chart.render import RenderError, render_documents
from kubeddp.tools.manifests.helm_engine import merge_values
from kubeddp.tools.manifests.kinds import KINDS, Ignored, JobKind, Lands, Refused, trainjob_fields
from kubeddp.tools.manifests.kinds.trainjob import RUNTIME_DECIDES
from kubeddp.tools.manifests.kinds.values import POD_FIELDS
from tests.helpers.kind_samples import SAMPLES, SETTABLE, untabled

pytestmark = pytest.mark.timeout(300)


def _without(values: dict[str, Any], path: str) -> dict[str, Any]:
    """`values` less the value at `path`: the sample's context alone."""
    context = copy.deepcopy(values)
    *parents, key = path.split(".")
    node = context
    for part in parents:
        node = node[part]
    del node[key]
    return context


@functools.cache
def _objects(chart_kind: str, values_json: str) -> dict[str, dict]:
    values = merge_values({"kind": chart_kind, "fullnameOverride": "demo"}, json.loads(values_json))
    return {doc["kind"]: doc for doc in render_documents(values)}


def objects(kind: JobKind, values: dict[str, Any]) -> dict[str, dict]:
    """The objects rendered for `kind` with `values`, by resource kind."""
    return _objects(kind.chart_kind, json.dumps(values, sort_keys=True))


def test_every_value_has_a_sample() -> None:
    """A new chart value needs a sample here, or the test below cannot set it."""
    assert sorted(SAMPLES) == sorted(SETTABLE)


@pytest.mark.parametrize("kind", KINDS.values(), ids=lambda kind: kind.name)
def test_every_kind_says_how_it_takes_every_value(kind: JobKind) -> None:
    """A value a kind's table forgets (or one it names that the chart lacks) fails here."""
    assert untabled(kind) == [], f"tools/manifests/kinds/{kind.name}.py TAKES"


@pytest.mark.parametrize(
    ("kind", "path"),
    [(kind, path) for kind in KINDS.values() for path in SETTABLE],
    ids=lambda item: item.name if isinstance(item, JobKind) else item,
)
def test_each_value_lands_or_is_refused(kind: JobKind, path: str) -> None:
    how = kind.takes.get(path)
    assert how is not None, f"tools/manifests/kinds/{kind.name}.py TAKES has no entry for {path!r}"
    sample = SAMPLES[path]
    if isinstance(how, Refused):
        with pytest.raises(RenderError) as refused:
            objects(kind, sample)
        message = str(refused.value)
        assert "\n" not in message and f"cannot be set for kind {kind.chart_kind}" in message
        assert f"{how.by or path} (" in message
        return
    got, context = objects(kind, sample), objects(kind, _without(sample, path))
    changed = {name for name in set(got) | set(context) if got.get(name) != context.get(name)}
    if isinstance(how, Ignored):
        assert changed == set(), f"{kind.chart_kind} does not ignore {path}: it changes {changed}"
        return
    assert isinstance(how, Lands)
    missing = set(how.objects) - changed
    assert not missing, f"{path} set for {kind.chart_kind} does not reach {sorted(missing)}"


def pod_fields(template: dict[str, Any]) -> dict[str, Any]:
    """A pod template's fields as POD_FIELDS names them: metadata.X, spec.X, container.X."""
    spec = dict(template["spec"])
    (container,) = spec.pop("containers")
    parts = {"metadata": template["metadata"], "spec": spec, "container": container}
    return {
        f"{part}.{key}": value for part, fields in parts.items() for key, value in fields.items()
    }


def changed_pod_fields(path: str) -> set[str]:
    """The pod fields the value's sample changes in the Indexed Job, which writes the pod of
    templates/_pod.tpl whole (no operator takes a part of it)."""
    kind, sample = KINDS["indexedjob"], SAMPLES[path]
    got, context = (
        pod_fields(objects(kind, values)["Job"]["spec"]["template"])
        for values in (sample, _without(sample, path))
    )
    return {field for field in set(got) | set(context) if got.get(field) != context.get(field)}


@pytest.mark.parametrize("path", list(POD_FIELDS))
def test_a_pod_field_is_carried_where_its_table_says(path: str) -> None:
    """POD_FIELDS names the field that carries each value, and a TrainJob (whose CRD admits some
    pod fields only) refuses the value or carries every field it writes: none is dropped."""
    changed = changed_pod_fields(path)
    assert POD_FIELDS[path] in changed, f"{path} writes {sorted(changed)}"
    if isinstance(KINDS["trainjob"].takes[path], Lands):
        dropped = changed - trainjob_fields.admitted() - set(RUNTIME_DECIDES)
        assert dropped == set(), f"a TrainJob would drop {path}'s {sorted(dropped)}"
