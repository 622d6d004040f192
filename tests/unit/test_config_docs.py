"""The configuration reference (docs/config-reference.md) lists every key with its true default."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from kubeddp.trainer.config import CHOICES, Config
from tests.helpers.readme import DOCS, doc_section

pytestmark = pytest.mark.timeout(30)
DOC = DOCS / "config-reference.md"
ROW_RE = re.compile(r"^\| `([a-z0-9_]+\.[a-z0-9_]+)` \| `([^`]*)` \| (.+) \|$")


def documented() -> dict[str, tuple[str, str]]:
    """key -> (default as written, meaning) from the configuration reference table."""
    section = doc_section(DOC, "Configuration reference")
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        found = ROW_RE.match(line)
        if found:
            assert found[1] not in rows, f"{found[1]} is documented twice"
            rows[found[1]] = (found[2], found[3])
    return rows


def actual() -> dict[str, object]:
    """key -> default, from the config dataclasses."""
    keys: dict[str, object] = {}
    for section in dataclasses.fields(Config):
        defaults = section.default_factory()  # type: ignore[misc]
        for item in dataclasses.fields(defaults):
            keys[f"{section.name}.{item.name}"] = getattr(defaults, item.name)
    return keys


def test_every_key_is_documented_and_nothing_else() -> None:
    assert sorted(documented()) == sorted(actual())


def test_documented_defaults_are_the_real_ones() -> None:
    rows = documented()
    wrong = {
        k: (rows[k][0], json.dumps(v)) for k, v in actual().items() if rows[k][0] != json.dumps(v)
    }
    assert not wrong, f"documented vs real default: {wrong}"


def test_every_allowed_value_is_named() -> None:
    rows = documented()
    for key, allowed in CHOICES.items():
        missing = [v for v in allowed if f"`{v}`" not in rows[key][1]]
        assert not missing, f"{key}: {missing} not in {rows[key][1]!r}"
