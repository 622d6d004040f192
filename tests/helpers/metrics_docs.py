"""The metrics tables of docs/metrics.md, read by section: what each documented metric is."""

from __future__ import annotations

import re

from tests.helpers.readme import DOCS, doc_section

METRICS_PAGE = DOCS / "metrics.md"
ROW = re.compile(r"^\| `(kubeddp_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|")


def metric_rows(section: str) -> dict[str, tuple[str, set[str]]]:
    """Every table row under the heading `section`: name -> (type, label names)."""
    rows = {}
    for line in doc_section(METRICS_PAGE, section).splitlines():
        row = ROW.match(line)
        if row:
            rows[row.group(1)] = (row.group(2), set(re.findall(r"`(\w+)`", row.group(3))))
    return rows
