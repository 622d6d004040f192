"""The pieces the chart's value definitions are made of: `Value`, `Flag`, `Section`, helpers
that write a value's JSON schema, and the converters of `kubeddp render` options that are not
one value (an image reference, MIN:MAX, pull secret names)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubeddp.tools import patterns as P

Converter = Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Flag:
    """A `kubeddp render` option. `read` says how argparse takes it:

    text/int: one value; pairs: repeatable K=V into a mapping; list: repeatable; switch:
    --x/--no-x; yaml-list/yaml-map: inline YAML/JSON or a file; config-file / config-set: the
    trainer config file / `section.key=value` overrides.
    """

    options: tuple[str, ...]
    read: str = "text"
    help: str = ""  # empty: the value's doc
    metavar: str | None = None
    sets: tuple[str, ...] = ()  # empty: the value it is attached to
    convert: Converter | None = None  # the parsed option -> {value path: value}

    @property
    def name(self) -> str:
        return self.options[-1]


@dataclass(frozen=True)
class Value:
    path: str
    schema: dict[str, Any]
    default: Any
    doc: str
    group: str
    flags: tuple[Flag, ...] = ()


@dataclass(frozen=True)
class Section:
    """A mapping of values; its doc heads the block in values.yaml."""

    path: str
    doc: str


# --- schema helpers ---------------------------------------------------------------------------


def text(pattern: P.Pattern | None = None, nullable: bool = False, **more: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"type": ["string", "null"] if nullable else "string", **more}
    if pattern:
        node["pattern"] = pattern.regex
    return node


def integer(minimum: int | None = None, nullable: bool = False) -> dict[str, Any]:
    node: dict[str, Any] = {"type": ["integer", "null"] if nullable else "integer"}
    if minimum is not None:
        node["minimum"] = minimum
    return node


def choice(options: tuple, nullable: bool = False) -> dict[str, Any]:
    if nullable:
        return {"type": ["string", "null"], "enum": [None, *options]}
    return {"type": "string", "enum": list(options)}


def k8s(definition: str) -> dict[str, Any]:
    """A Kubernetes type: its definition comes from kubernetes-validate (tools/gen_chart.py)."""
    return {"$ref": f"#/definitions/io.k8s.api.core.v1.{definition}"}


def k8s_list(definition: str) -> dict[str, Any]:
    return {"type": "array", "items": k8s(definition)}


def string_map(key: P.Pattern | None = None, value: P.Pattern | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "object", "additionalProperties": text(value)}
    if key:
        node["propertyNames"] = {"pattern": key.regex}
    return node


def label_map() -> dict[str, Any]:
    node = string_map(P.QUALIFIED_NAME, P.LABEL_VALUE)
    node["propertyNames"]["maxLength"] = 316  # 253 prefix + '/' + 63 name
    node["additionalProperties"]["maxLength"] = 63
    return node


def boolean() -> dict[str, Any]:
    return {"type": "boolean"}


# --- converters of options that are not one value ------------------------------------------


def image_values(reference: str) -> dict[str, Any]:
    """repo[:port]/name[:tag][@digest] -> image.repository/tag/digest (no tag: latest)."""
    name, _, digest = reference.partition("@")
    repository, tag = name, ""
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        repository, tag = name[:colon], name[colon + 1 :]
    if not tag and not digest:
        tag = "latest"  # what Kubernetes pulls for a reference without tag
    return {"image.repository": repository, "image.tag": tag, "image.digest": digest}


class OptionError(ValueError):
    """A render option cannot be read; the message starts with the option."""


def elastic_values(text_value: str) -> dict[str, Any]:
    low, sep, high = text_value.partition(":")
    if not (sep and low.isdigit() and high.isdigit()):
        raise OptionError(f"--elastic: {text_value!r} is not MIN:MAX; write e.g. --elastic 2:4")
    return {"elastic.enabled": True, "elastic.minNodes": int(low), "elastic.maxNodes": int(high)}


def pull_secrets(secret_names: list[str]) -> dict[str, Any]:
    return {"imagePullSecrets": [{"name": secret} for secret in secret_names]}


def resource(section: str, name: str, option: str, help_text: str) -> Flag:
    path = f"resources.{section}.{name}"
    return Flag((option,), help=help_text, sets=(path,))


def switch(option: str, help_text: str = "") -> Flag:
    return Flag((option,), read="switch", help=help_text)


def pairs(option: str, help_text: str = "") -> Flag:
    return Flag((option,), read="pairs", metavar="K=V", help=help_text)
