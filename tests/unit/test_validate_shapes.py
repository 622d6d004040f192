"""`validate` on every field of each job kubeddp renders replaced by a value of another type
(a list, a string, a number): problems are reported, nothing crashes. The kinds' own
rules (tools/manifests/kinds) read fields a schema has not checked yet, so each must cope with any
shape."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from kubeddp.tools.manifests.validate import validate_documents
from tests.helpers import render

pytestmark = pytest.mark.timeout(120)
WRONG = ([1], "x", 7)  # not iterable, iterable but not a mapping, a list
MAX_DEPTH = 9  # deep enough to reach every container's env of every kind


def _paths(node: object, prefix: tuple = ()) -> Iterator[tuple]:
    if len(prefix) >= MAX_DEPTH:
        return
    items = node.items() if isinstance(node, dict) else enumerate(node[:1]) if isinstance(
        node, list) else ()  # fmt: skip
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _jobs() -> list[dict]:
    return [render.job_of(kind, "--name", "shape") for kind in ("pytorchjob", "trainjob",
                                                                 "indexedjob")]  # fmt: skip


def test_no_shape_crashes_validation() -> None:
    cases = 0
    for job in _jobs():
        for path in _paths(job):
            for wrong in WRONG:
                doc = copy.deepcopy(job)
                node = doc
                for key in path[:-1]:
                    node = node[key]
                node[path[-1]] = wrong
                validate_documents([doc], "shapes")  # must not raise
                cases += 1
    assert cases > 500, cases
