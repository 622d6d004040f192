"""The one reader of YAML that users hand kubeddp: config files, --set values, render options,
manifests for `kubeddp validate`, kubeconfigs, the chart's own output.

Every input is bounded, so none can exhaust memory or the stack, or be silently misread:
- text only: UTF-8 without NUL bytes, at most MAX_BYTES (a binary file is one line, not a
  traceback);
- nesting at most MAX_DEPTH levels, also through aliases (a deep file is one line, not a
  RecursionError in whatever walks the data next);
- aliases may add at most MAX_ALIAS_NODES nodes to a document (a "billion laughs" file fails at
  once instead of using gigabytes), and may not refer to themselves;
- a key given twice in one mapping is refused, naming the key and both lines (YAML's
  last-one-wins would silently drop the first);
- plain JSON types only, as Kubernetes reads YAML: a date stays a string, and tags that make
  other Python types (!!binary, !!set, ...) are refused.

Errors are `YamlInputError`, one line that names the source and the line.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 100
MAX_ALIAS_NODES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_NOT_JSON_TAGS = ("binary", "timestamp", "omap", "pairs", "set")


class YamlInputError(ValueError):
    """A file or value that is not plain, bounded YAML; the message is one line. `syntax` is
    true when the text is not YAML at all (rather than YAML beyond a bound)."""

    def __init__(self, message: str, syntax: bool = False) -> None:
        super().__init__(message)
        self.syntax = syntax


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}" if mark is not None else ""


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line report as one line: what went wrong, and where (1-based lines)."""
    parts = []
    for what, mark in (("context", "context_mark"), ("problem", "problem_mark")):
        text = getattr(exc, what, None)
        if text:
            parts.append(f"{text}{_at(getattr(exc, mark, None))}")
    return ": ".join(parts) or " ".join(str(exc).split()) or type(exc).__name__


class _Limit(yaml.YAMLError):
    """A bound of this module was exceeded (a message of ours, not a syntax error)."""


class _Loader(yaml.SafeLoader):
    """SafeLoader with the bounds above; timestamps resolve to strings."""

    yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Limit(f"nested deeper than {MAX_DEPTH} levels{_at(mark)}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Node, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):
            seen: dict[tuple[str, Any], Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                    continue  # merged keys may be overridden; complex keys PyYAML refuses
                key = self.construct_object(key_node)
                ident = (type(key).__name__, key)
                if ident in seen:
                    first = seen[ident]
                    raise _Limit(
                        f"key {key!r} is given twice in one mapping (line {first.line + 1} and "
                        f"line {key_node.start_mark.line + 1}); keep one"
                    )
                seen[ident] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _refuse_tag(name: str) -> Any:
    def construct(loader: _Loader, node: Node) -> Any:
        raise _Limit(
            f"the tag !!{name}{_at(node.start_mark)} makes a value JSON cannot hold; "
            "write it as a plain string, number, list or mapping"
        )

    return construct


_Loader.yaml_constructors = dict(yaml.SafeLoader.yaml_constructors)
for _name in _NOT_JSON_TAGS:
    _Loader.add_constructor(f"tag:yaml.org,2002:{_name}", _refuse_tag(_name))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: Node) -> None:
    """Count the document as its consumers see it, every alias expanded: node count and depth
    (iteratively: the graph may be deeper than Python's stack), and refuse cycles."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    raw = 0
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = _children(node)
            size[key] = 1 + sum(size[id(kid)] for kid in kids)
            depth[key] = 1 + max((depth[id(kid)] for kid in kids), default=0)
            if depth[key] > MAX_DEPTH:
                raise _Limit(
                    f"nested deeper than {MAX_DEPTH} levels through aliases{_at(node.start_mark)}"
                )
            continue
        if key in size:
            continue
        if key in depth:  # entered, not finished: an ancestor of itself
            raise _Limit(f"an alias refers to its own anchor{_at(node.start_mark)}")
        depth[key] = -1
        raw += 1
        stack.append((node, True))
        for kid in _children(node):
            if depth.get(id(kid)) == -1 and id(kid) not in size:
                raise _Limit(f"an alias refers to its own anchor{_at(kid.start_mark)}")
            if id(kid) not in size:
                stack.append((kid, False))
    if size[id(root)] - raw > MAX_ALIAS_NODES:
        raise _Limit(
            f"aliases expand it to {size[id(root)]} nodes (more than {MAX_ALIAS_NODES} beyond "
            "the file's own); write the values out instead of repeating anchors"
        )


def load_all(text: str, source: str, fix: str = "fix the syntax") -> list[Any]:
    """Every document of `text` (empty documents dropped); YamlInputError names `source`, and
    `fix` is what a syntax error's message tells the user to do."""
    if len(text) > MAX_BYTES:
        raise YamlInputError(
            f"{source} is larger than {MAX_BYTES // (1024 * 1024)} MiB; split it into smaller files"
        )
    loader = _Loader(text)
    docs = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            _check_expansion(node)
            docs.append(loader.construct_document(node))
    except _Limit as exc:
        raise YamlInputError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise YamlInputError(
            f"{source} is not valid YAML ({describe_yaml_error(exc)}); {fix}", syntax=True
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5000 digits
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise YamlInputError(f"{source}: a value cannot be read ({first})") from None
    finally:
        loader.dispose()
    return [doc for doc in docs if doc is not None]


def load_one(text: str, source: str, fix: str = "fix the syntax") -> Any:
    """The single document of `text` (None when empty); more than one is an error."""
    docs = load_all(text, source, fix)
    if len(docs) > 1:
        raise YamlInputError(f"{source} holds {len(docs)} YAML documents; give one")
    return docs[0] if docs else None


def decode_text(data: bytes, source: str) -> str:
    """UTF-8 text (a BOM is allowed) without NUL bytes, or one line saying what it is."""
    if len(data) > MAX_BYTES:
        raise YamlInputError(
            f"{source} is larger than {MAX_BYTES // (1024 * 1024)} MiB; split it into smaller files"
        )
    nul = data.find(b"\0")
    if nul >= 0:
        raise YamlInputError(
            f"{source} is not a text file (a NUL byte at offset {nul}); give a YAML file"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YamlInputError(
            f"{source} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from None


def read_text(path: str | os.PathLike[str], source: str | None = None) -> str:
    """A regular text file, read at most MAX_BYTES + 1 bytes far; OSError as is.

    Opened without blocking and refused unless a regular file: a FIFO would block forever
    (open waits for a writer, read for its data), a device such as /dev/zero never ends."""
    source = source or str(path)
    fd = os.open(Path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket is never "
                          "read); give the path of a YAML file")  # fmt: skip
        data = handle.read(MAX_BYTES + 1)
    return decode_text(data, source)


def load_file(path: str | os.PathLike[str], source: str | None = None) -> Any:
    """read_text + load_one."""
    source = source or str(path)
    return load_one(read_text(path, source), source)
