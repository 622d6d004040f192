"""trainer/yaml_io.py, the one reader of YAML users hand kubeddp: what it accepts as before,
and each bound (size, text, depth, aliases, duplicate keys, non-JSON tags) as one line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kubeddp.trainer import yaml_io
from tests.helpers.bad_inputs import LAUGHS

pytestmark = pytest.mark.timeout(60)


def test_plain_yaml_reads_as_json_types() -> None:
    text = "a: 1\nb: [x, 2.5, true, null]\nday: 2024-01-31\noff_word: off\n"
    assert yaml_io.load_one(text, "t") == {
        "a": 1,
        "b": ["x", 2.5, True, None],
        "day": "2024-01-31",  # a string, as Kubernetes reads it; never a datetime.date
        "off_word": False,
    }


def test_merge_keys_and_small_anchors_still_work() -> None:
    text = "base: &b {cpu: 1, mem: 2}\npod:\n  <<: *b\n  mem: 4\nalso: *b\n"
    assert yaml_io.load_one(text, "t") == {
        "base": {"cpu": 1, "mem": 2},
        "pod": {"cpu": 1, "mem": 4},
        "also": {"cpu": 1, "mem": 2},
    }


def test_several_documents_and_empty_ones() -> None:
    assert yaml_io.load_all("a: 1\n---\n---\nb: 2\n", "t") == [{"a": 1}, {"b": 2}]
    assert yaml_io.load_one("", "t") is None
    with pytest.raises(yaml_io.YamlInputError, match="holds 2 YAML documents"):
        yaml_io.load_one("a: 1\n---\nb: 2\n", "t")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: 1\nb: 2\na: 3\n", ["key 'a' is given twice", "line 1 and line 3"]),
        ("x:\n  y: 1\n  y: 1\n", ["key 'y' is given twice"]),
        (LAUGHS, ["aliases expand it to", "nodes"]),
        ("a: &a [*a]\n", ["refers to its own anchor"]),
        ("[" * 2000 + "]" * 2000, ["nested deeper than 100 levels"]),
        ("a: !!set {x, y}\n", ["!!set", "JSON cannot hold"]),
        ("a: !!timestamp 2024-01-01\n", ["!!timestamp"]),
        ("a: !!python/name:os.system\n", ["not valid YAML", "constructor"]),
        ("n: " + "1" * 5000 + "\n", ["cannot be read", "digits"]),
        ("a: [1\n", ["not valid YAML", "line 2"]),
    ],
    ids=["dup", "dup-nested", "laughs", "recursive", "deep", "set", "timestamp", "python",
         "bigint", "syntax"],
)  # fmt: skip
def test_each_bound_is_one_line_naming_the_source(text: str, words: list[str]) -> None:
    with pytest.raises(yaml_io.YamlInputError) as err:
        yaml_io.load_all(text, "values.yaml")
    message = str(err.value)
    assert message.startswith("values.yaml") and "\n" not in message, message
    for word in words:
        assert word in message, message


def test_aliases_nested_deeper_than_the_bound_are_refused() -> None:
    # Each anchor is shallow, but aliases stack them: the data a consumer walks is deep.
    lines = ["l0: &l0 [x]"] + [f"l{i}: &l{i} [[[[[[[[*l{i - 1}]]]]]]]]" for i in range(1, 20)]
    with pytest.raises(yaml_io.YamlInputError, match="deeper than 100 levels through aliases"):
        yaml_io.load_all("\n".join(lines) + "\n", "t")


def test_a_bomb_fails_fast() -> None:
    start = time.monotonic()
    with pytest.raises(yaml_io.YamlInputError):
        yaml_io.load_all(LAUGHS.replace("[x, x", "[" + "x, " * 50 + "x"), "t")
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(
    ("data", "word"),
    [
        (b"a: 1\0\n", "NUL byte at offset 4"),
        (b"a: \xff\n", "byte 0xff at offset 3"),
        (b"\x89PNG\r\n\x1a\n", "not UTF-8"),
    ],
)
def test_files_that_are_not_text(tmp_path: Path, data: bytes, word: str) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(data)
    with pytest.raises(yaml_io.YamlInputError, match=word):
        yaml_io.load_file(path)


def test_a_bom_is_fine_and_size_is_bounded(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert yaml_io.load_file(path) == {"a": 1}
    monkeypatch.setattr(yaml_io, "MAX_BYTES", 10)
    path.write_bytes(b"a: 1\n" * 3)
    with pytest.raises(yaml_io.YamlInputError, match="larger than"):
        yaml_io.load_file(path)


def test_an_endless_file_is_refused() -> None:
    with pytest.raises(OSError, match="not a regular file"):
        yaml_io.read_text("/dev/zero")


def test_a_fifo_is_refused_without_blocking(tmp_path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # no writer: opening it to read would block forever
    with pytest.raises(OSError, match="not a regular file"):
        yaml_io.read_text(fifo)
