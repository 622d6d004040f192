"""Whether a hand-written text states which kinds take a chart value (the kinds' `takes` tables
say that, and the note written from them: tools/manifests/chart/kind_notes.py)."""

from __future__ import annotations

import re

from kubeddp.tools.manifests.kinds import KINDS, Ignored, Refused

KIND_NAMES = [kind.chart_kind for kind in KINDS.values()]
K = "(?:" + "|".join(KIND_NAMES) + ")"
# Ways a text says "only these kinds": "PyTorchJob only", "only for a TrainJob", "not for a
# TrainJob", "(PyTorchJob)", "(PyTorchJob, IndexedJob; ...)", "for a TrainJob".
RESTRICTION = re.compile(
    rf"\b{K} only\b|\bonly (?:for |on |in )?(?:an? )?{K}\b|\bnot (?:for|on|in) (?:an? )?{K}\b"
    rf"|\({K}(?:\s*[,;)]| and\b)|\b(?:for|on|in) an? {K}\b"
)


def not_taking(paths: list[str]) -> set[str]:
    """The kinds that refuse or ignore one of the values."""
    return {
        kind.chart_kind
        for kind in KINDS.values()
        for path in paths
        if isinstance(kind.takes.get(path), Refused | Ignored)
    }


def partly_taken(paths: list[str]) -> bool:
    return bool(not_taking(paths))


def restriction_in(text: str, paths: list[str]) -> str:
    """What in a hand-written text states a kind restriction ('' when nothing does). A value
    every kind takes may explain how each kind treats it ("IndexedJob: failed pods..."); one
    that some kind does not take may neither start with a kind nor name a kind that refuses
    or ignores it: the generated note says that."""
    found = RESTRICTION.search(text)
    if found:
        return found[0]
    if partly_taken(paths):
        starts = re.match(rf"\s*(?:\w+ )?{K}\s*:", text)
        if starts:
            return starts[0]
        for name in sorted(not_taking(paths)):
            if re.search(rf"\b{name}\b", text):
                return name
    return ""
