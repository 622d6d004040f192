"""docs/exit-codes.md is generated from trainer/exit_codes.TABLE (`make chart`), is current, and
the README's "Exit codes" section links it."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from kubeddp.tools.generate.exit_codes_doc import EXIT_CODES_DOC, exit_codes_doc
from kubeddp.trainer import exit_codes

pytestmark = pytest.mark.timeout(30)
REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| (training|cli|both) \| [^|]+ \| ([^|]+) \| [^|]+ \|$")


def test_the_page_is_current() -> None:
    assert (REPO / EXIT_CODES_DOC).read_text() == exit_codes_doc(), "stale; run `make chart`"


def test_every_code_has_one_row_saying_who_retries_it() -> None:
    rows = {
        int(found[1]): (found[2].strip(), found[4])
        for line in exit_codes_doc().splitlines()
        if (found := ROW.match(line))
    }
    assert sorted(rows) == sorted(entry.code for entry in exit_codes.TABLE)
    for entry in exit_codes.TABLE:
        name, retried = rows[entry.code]
        assert name == entry.name
        if entry.where != "cli" and entry.code != exit_codes.OK:
            assert ("recreated" in retried) is entry.retryable, entry
    for code in exit_codes.CASCADE:  # what the Indexed Job's policy ignores
        assert "not counted" in rows[code][1]
    assert "counted against backoffLimit" in rows[exit_codes.KILLED][1]


def test_readme_exit_codes_section_links_the_page() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert f"({EXIT_CODES_DOC.as_posix()})" in section


def code_constants(module: object) -> dict[str, int]:
    """The exit-code constants a module defines: upper-case names bound to an int (the
    threshold RETRYABLE_FROM is not a code)."""
    return {
        name: value
        for name, value in vars(module).items()
        if name.isupper() and type(value) is int and name != "RETRYABLE_FROM"
    }


def test_every_exit_code_constant_has_its_table_row() -> None:
    """A constant without its row in TABLE would end a pod with a code that docs/exit-codes.md,
    describe() and the status line know nothing of."""
    constants = code_constants(exit_codes)
    assert sorted(constants.values()) == sorted(entry.code for entry in exit_codes.TABLE)
    assert len(set(constants.values())) == len(constants), "two names for one code"
    unused = next(code for code in range(200, 256) if code not in exit_codes.BY_CODE)
    forgot = types.SimpleNamespace(**vars(exit_codes), SLOW_STORAGE=unused)  # no row for it
    assert set(code_constants(forgot).values()) - set(exit_codes.BY_CODE) == {unused}
