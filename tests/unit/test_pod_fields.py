"""Every field the chart writes in a training pod is either carried by a chart value (its
`POD_FIELDS` entry, tools/manifests/kinds/values.py: tested value by value in
test_kind_values.py) or one of the pod's own fields that docs/manifests-and-chart.md's table
"The pod's own fields" names and explains. A field added to templates/_pod.tpl and nothing else
(no value, no docs row: a pod setting no user can see or change) fails here, by its name
(issue 38); so does a row for a field no template writes any more."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeddp.tools.manifests.kinds.values import POD_FIELDS
from tests.helpers.chart import CHART, CI_FILES, ci_values, render

pytestmark = pytest.mark.timeout(120)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "manifests-and-chart.md"
TABLE_TITLE = "### The pod's own fields"
# The objects that hold a training pod, or (TrainJob) the parts its pod is split into.
POD_HOLDERS = {"PyTorchJob", "Job", "TrainJob", "TrainingRuntime"}


def documented_fields(text: str) -> set[str]:
    """The first column of the table under TABLE_TITLE: `spec.X` or `container.X`."""
    section = text.split(TABLE_TITLE, 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `((?:spec|container)\.\w+)` \|", section, flags=re.M))


def pod_specs(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod spec (a mapping with `containers`) inside a rendered object."""
    if isinstance(node, dict):
        if "containers" in node:
            yield node
        for value in node.values():
            yield from pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from pod_specs(value)


def rendered_fields(documents: list[dict[str, Any]]) -> set[str]:
    """`spec.X` for each key of a training pod's spec, `container.X` for each of its
    containers' keys."""
    found = set()
    for doc in documents:
        if doc.get("kind") not in POD_HOLDERS:
            continue
        for spec in pod_specs(doc):
            found |= {f"spec.{key}" for key in spec}
            found |= {f"container.{key}" for c in spec["containers"] for key in c}
    return found


def unexplained(fields: set[str], documented: set[str]) -> list[str]:
    carried = set(POD_FIELDS.values())
    return sorted(fields - carried - documented)


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda path: path.name)
def test_every_pod_field_is_a_value_or_documented(values_file: Path) -> None:
    documented = documented_fields(DOCS.read_text())
    fields = rendered_fields(render(ci_values(values_file)))
    assert {"spec.containers", "container.image"} <= fields
    missing = unexplained(fields, documented)
    assert not missing, (
        f"the chart writes these fields in a training pod ({values_file.name}) that no chart "
        "value carries (tools/manifests/kinds/values.py POD_FIELDS) and that "
        f"docs/manifests-and-chart.md's table {TABLE_TITLE!r} does not name: add the value, or "
        "the row saying what the field does and why kubeddp sets it: " + ", ".join(missing)
    )


def test_every_documented_pod_field_is_written() -> None:
    # The docs table names only fields a template still writes (`name:` in a template).
    templates = "\n".join(p.read_text() for p in (CHART / "templates").glob("*.*"))
    documented = documented_fields(DOCS.read_text())
    assert len(documented) >= 8
    stale = [f for f in sorted(documented) if not re.search(rf"\b{f.split('.')[1]}:", templates)]
    assert not stale, f"{TABLE_TITLE!r} names fields no template writes: {stale}"
    assert not documented & set(POD_FIELDS.values()), "a value's field needs no row of its own"


def test_the_check_names_a_field_nothing_explains() -> None:
    # It must be able to fail: a pod that also has enableServiceLinks, which nothing explains.
    documented = documented_fields(DOCS.read_text())
    pod = {"kind": "Job", "spec": {"template": {"spec": {"containers": [{"image": "i"}]}}}}
    pod["spec"]["template"]["spec"]["enableServiceLinks"] = False
    assert unexplained(rendered_fields([pod]), documented) == ["spec.enableServiceLinks"]
    assert unexplained(rendered_fields([{**pod, "kind": "Deployment"}]), documented) == []
