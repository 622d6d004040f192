"""Which kinds take a chart value is said in its help only by the note written from the kinds'
`takes` tables (tools/manifests/chart/kind_notes.py): `kubeddp render --help`, values.yaml and the
chart README name exactly the kinds whose table says the value lands, and no hand-written doc,
option help or section doc states a kind restriction of its own."""

from __future__ import annotations

import contextlib
import functools
import io
import re
from pathlib import Path

import pytest

from kubeddp.tools.cli.main import parse_command
from kubeddp.tools.generate.chart_files import CHART
from kubeddp.tools.manifests.chart.values import FLAGS, SECTIONS, VALUES
from kubeddp.tools.manifests.kinds import KINDS, Lands
from tests.helpers.kind_restrictions import K, partly_taken, restriction_in

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


def hand_written() -> list[tuple[str, str, list[str]]]:
    """(where, text, the values it is about) for every doc, option help and section doc."""
    texts = [(f"Value {v.path} doc", v.doc, [v.path]) for v in VALUES]
    texts += [(f"Flag {f.name} help", f.help, [v.path]) for f, v in FLAGS if f.help]
    for section in SECTIONS:
        inside = [v.path for v in VALUES if v.path.startswith(section.path + ".")]
        texts.append((f"Section {section.path} doc", section.doc, inside))
    return texts


def test_no_hand_written_text_states_a_kind_restriction() -> None:
    stated = {
        where: found
        for where, text, paths in hand_written()
        if (found := restriction_in(text, paths))
    }
    assert stated == {}, (
        "say it in the kind's TAKES table (tools/manifests/kinds/*.py), not in the help"
    )


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("IfNotPresent; TrainJob: must stay null (no such field)", "image.pullPolicy"),
        ("PriorityClass of the pods (PyTorchJob, IndexedJob; set it in the runtime)", "nodes"),
        ("every key as env (not for a TrainJob: it has no envFrom)", "envFrom"),
        ("PyTorchJob: pods deleted when the job ends", "cleanPodPolicy"),
        ("Gang scheduling (PyTorchJob): every pod starts together", "gang.scheduler"),
        ("the runtime's name, TrainJob only", "trainJob.runtimeName"),
        ("fewest pods; IndexedJob runs a fixed count", "elastic.minNodes"),
    ],
)
def test_a_restriction_written_by_hand_is_caught(text: str, path: str) -> None:
    assert restriction_in(text, [path]) != ""


def takers(path: str) -> list[str]:
    return [kind.chart_kind for kind in KINDS.values() if isinstance(kind.takes.get(path), Lands)]


def expected_note(path: str) -> str:
    """'<kinds whose table says it lands> only', read from the tables here, not from the note
    maker; '' when every kind takes it."""
    if not partly_taken([path]):
        return ""
    names = takers(path)
    return (", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]) + " only"


@functools.cache
def option_helps() -> dict[str, str]:
    """`kubeddp render --help`: option -> its help, on one line."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_command(["render", "--help"])
    entries = re.split(r"\n  (?=-)", out.getvalue())[1:]
    return {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries}


def readme_rows() -> dict[str, str]:
    text = (REPO / CHART / "README.md").read_text()
    return {row[1]: row[0] for row in re.findall(r"^(\| `([\w.]+)` \|.*)$", text, re.M)}


def values_yaml() -> str:
    return " ".join(
        line.strip().lstrip("#").strip()
        for line in (REPO / CHART / "values.yaml").read_text().splitlines()
    )


NOTE = re.compile(rf"\b{K}(?:(?:, | and ){K})* only\b")


@pytest.mark.parametrize("value", VALUES, ids=lambda value: value.path)
def test_help_and_tables_name_the_kinds_that_take_the_value(value) -> None:
    note, row = expected_note(value.path), readme_rows()[value.path]
    assert NOTE.findall(row) == ([note] if note else []), row
    if note:
        assert note in values_yaml()
        for flag, owner in FLAGS:
            if owner is value and flag.read not in ("kind", "program-args"):
                assert NOTE.findall(option_helps()[flag.options[0]]) == [note], flag.name
