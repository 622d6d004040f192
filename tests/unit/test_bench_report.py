"""The benchmark report's ratio and absolute columns agree: rows made from made-up alternating
pairs (tests/bench/common.paired) are rendered by report.py, and the ratio printed in each row
is the quotient of the two values printed beside it; a row whose ratio is not that quotient is
said to disagree in the table."""

from __future__ import annotations

import re

import pytest

from tests.bench.common import Row, paired
from tests.bench.report import disagreement, render_markdown

INFO = {"cpu": "made-up", "cores": "2", "python": "3", "torch": "2", "cuda": "none"}


def _table_cells(markdown: str) -> list[list[str]]:
    lines = [x for x in markdown.splitlines() if x.startswith("| ") and "---" not in x]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", x)[1:-1]] for x in lines[1:]]


def _printed_values(absolute: str) -> tuple[float, float]:
    a, b = re.match(r"([0-9,.]+) vs ([0-9,.]+) ", absolute).groups()
    return float(a.replace(",", "")), float(b.replace(",", ""))


@pytest.mark.parametrize(
    "pairs",
    [
        # five alternating pairs, samples per CPU-second: the ratios are 0.95, 1.02, 0.98 ...
        [(1520.0, 1600.0), (1632.0, 1600.0), (1470.0, 1500.0), (1900.0, 1800.0), (990.0, 1000.0)],
        # an even count: the lower middle pair, not the mean of two (no pair has that ratio)
        [(10.0, 20.0), (30.0, 20.0), (21.0, 20.0), (19.0, 20.0)],
        # one pair (the --tiny mode)
        [(3.25, 3.05)],
        # large and small numbers: thousands separators, four significant digits
        [(123456.0, 120000.0), (118000.0, 120000.0), (121000.0, 120000.0)],
        [(0.01234, 0.01111), (0.0125, 0.0111), (0.013, 0.0111)],
    ],
)
def test_each_ratio_is_the_quotient_of_the_values_printed_beside_it(pairs) -> None:
    row = paired("overhead", "made up", "a made-up loop", pairs, "samples per CPU-second")
    ratios = sorted(a / b for a, b in pairs)
    assert row.ratio == ratios[(len(ratios) - 1) // 2]  # the median pair's (lower middle)
    assert (row.ratio is not None) and disagreement(row) == ""
    cells = _table_cells(render_markdown([row], INFO, "made-up", 1.0))
    assert len(cells) == 1
    _, _, ratio, _, absolute, _, note = cells[0]
    a, b = _printed_values(absolute)
    assert float(ratio) == pytest.approx(a / b, rel=2e-3)  # both as printed, rounded
    assert f"{len(pairs)} pair" in note
    if len(pairs) > 1:
        assert f"{min(ratios):.3f}–{max(ratios):.3f}" in note


def test_a_row_whose_ratio_is_not_its_values_quotient_is_flagged() -> None:
    good = paired("overhead", "right", "loop", [(95.0, 100.0), (99.0, 100.0)], "samples/s")
    wrong = Row(
        "overhead", "wrong", 1.003, "loop", "20.36 vs 20.42 CPU-ms", extra={"pair": [20.36, 20.42]}
    )
    plain = Row("overhead", "no pair", 0.9, "loop", "some text")
    assert disagreement(wrong).startswith("ratio 1.003 is not 20.36 / 20.42")
    cells = _table_cells(render_markdown([good, wrong, plain], INFO, "made-up", 1.0))
    assert [c[2] for c in cells] == [
        "0.950",
        "1.003 (DISAGREES: ratio 1.003 is not 20.36 / 20.42)",
        "0.900",
    ]
