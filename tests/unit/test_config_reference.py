"""docs/config-reference.md lists every trainer config key with its true default, type, allowed
values and doc; it is generated from trainer/config.py (`make chart`) and must be current."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kubeddp.tools.generate.chart_files import CONFIG_REFERENCE, config_reference
from kubeddp.trainer.config import config_fields, default_of

pytestmark = pytest.mark.timeout(30)
DOC = Path(__file__).resolve().parents[2] / CONFIG_REFERENCE
ROW_RE = re.compile(r"^\| `([a-z_0-9]+\.[a-z_0-9]+)` \| (\w+) \| `([^`]*)` \| (.*) \| (.+) \|$")


def documented() -> dict[str, tuple[str, str, str, str]]:
    """key -> (type, default as written, allowed, meaning) from the table."""
    rows: dict[str, tuple[str, str, str, str]] = {}
    for line in DOC.read_text().splitlines():
        found = ROW_RE.match(line)
        if found:
            assert found[1] not in rows, f"{found[1]} is documented twice"
            rows[found[1]] = (found[2], found[3], found[4], found[5])
    return rows


def test_the_page_is_current() -> None:
    assert DOC.read_text() == config_reference(), "stale; run `make chart`"


def test_every_key_is_documented_and_nothing_else() -> None:
    assert sorted(documented()) == sorted(path for path, _, _ in config_fields())


def test_documented_defaults_and_types_are_the_real_ones() -> None:
    rows = documented()
    for path, typ, item in config_fields():
        assert rows[path][0] == typ.__name__, path
        assert rows[path][1] == json.dumps(default_of(item)), path
        assert rows[path][3] == item.metadata["doc"], path


def test_every_allowed_value_and_range_is_named() -> None:
    rows = documented()
    for path, _, item in config_fields():
        allowed = rows[path][2]
        for choice in item.metadata.get("choices", ()):
            assert f"`{choice}`" in allowed, path
        numbers = {float(n) for n in re.findall(r"[-+]?\d+(?:\.\d*)?(?:e[-+]?\d+)?", allowed)}
        for bound in ("minimum", "above", "maximum"):
            if bound in item.metadata:
                assert float(item.metadata[bound]) in numbers, (path, allowed)
