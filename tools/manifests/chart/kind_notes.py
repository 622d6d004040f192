"""Which kinds take a chart value, said in its help: written from the kinds' `takes` tables
(tools/manifests/kinds/<kind>.py), never by hand, so `kubeddp render --help`, values.yaml, the
schema and the chart README's table say what `kubeddp render` and the chart do.

A value every kind takes gets no note; one that some kind refuses or ignores gets
"PyTorchJob only" (and, in the docs, each refusing kind's reason).
"""

from __future__ import annotations

from collections.abc import Iterable

from kubeddp.tools.manifests.chart.value_types import Flag, Section, Value
from kubeddp.tools.manifests.kinds import KINDS, Ignored, Lands, Refused


def _names(kinds: list[str]) -> str:
    return ", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else kinds[0]


def takers(path: str) -> list[str] | None:
    """The kinds (chart names) whose table says the value lands; None when every kind takes
    it (or no table names it, like `kind`)."""
    hows = {kind.chart_kind: kind.takes.get(path) for kind in KINDS.values()}
    if not any(isinstance(how, Refused | Ignored) for how in hows.values()):
        return None
    return [name for name, how in hows.items() if isinstance(how, Lands)]


def kind_note(path: str, reasons: bool = True) -> str:
    """'PyTorchJob only', with the refusing kinds' reasons when `reasons`; '' for a value every
    kind takes."""
    taking = takers(path)
    if taking is None:
        return ""
    note = f"{_names(taking)} only" if taking else "no kind takes it"
    if not reasons:
        return note
    why: dict[str, list[str]] = {}  # a reason -> the kinds that give it
    ignoring = []
    for kind in KINDS.values():
        how = kind.takes.get(path)
        if isinstance(how, Refused) and not how.by:  # `by`: its section's switch says why
            why.setdefault(how.why, []).append(kind.chart_kind)
        elif isinstance(how, Ignored):
            ignoring.append(kind.chart_kind)
    for reason, kinds in why.items():
        note += f"; {_names(kinds)} {'refuses' if len(kinds) == 1 else 'refuse'} it: {reason}"
    if ignoring:
        note += f"; {_names(ignoring)} {'ignores' if len(ignoring) == 1 else 'ignore'} it"
    return note


def _joined(text: str, note: str) -> str:
    if not note:
        return text
    return f"{text.rstrip('.')}. {note}"


def value_doc(value: Value) -> str:
    """The value's doc and its kind note: values.yaml, the schema, the chart README."""
    return _joined(value.doc, kind_note(value.path))


def flag_help(flag: Flag, value: Value) -> str:
    """An option's help (its own, else the value's doc) and the short kind note."""
    text = flag.help or value.doc
    note = kind_note(value.path, reasons=False)
    return f"{text} ({note})" if note else text


def section_doc(section: Section, values: Iterable[Value]) -> str:
    """The section's doc and the kinds that take every value in it, when they are the same."""
    inside = [v.path for v in values if v.path.startswith(section.path + ".")]
    notes = {kind_note(path, reasons=False) for path in inside}
    note = notes.pop() if len(notes) == 1 else ""
    return _joined(section.doc, note) + ("." if note else "")
