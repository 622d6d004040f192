"""`kubeddp render`: chart values -> the job's Kubernetes objects, rendered by Helm's own engine.

The Helm chart (installed as the package `kubeddp.chart`) is the one place manifests are
written. Before Helm runs, the values are checked against the chart's values.schema.json here,
so a bad value fails with one line naming the `kubeddp render` option; the chart's `fail` rules
name values in backticks, which become options the same way.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from kubeddp.tools.manifests import helm_engine, patterns
from kubeddp.tools.manifests.chart.render_options import Provenance
from kubeddp.tools.manifests.chart.values import option_for
from kubeddp.tools.manifests.k8s_names import CHECKPOINTS_ANNOTATION, NETWORK_ANNOTATION
from kubeddp.tools.manifests.resources import APPLY_FIRST, APPLY_LAST
from kubeddp.trainer import yaml_io

# Imported in functions: jsonschema, the `cli` extra: optional (a pod renders nothing).

CHART_PACKAGE = "kubeddp.chart"
HOOK_ANNOTATION = "helm.sh/hook"
# `helm test` pods are not part of the job; an install hook (a TrainJob's runtime) is
TEST_HOOKS = frozenset({"test", "test-success"})
_FAIL = re.compile(r"execution error at \([^)]*\): (.*)", re.S)
_VALUE_NAME = re.compile(r"`([A-Za-z][\w.]*)`")


class RenderError(ValueError):
    """Bad render input: one line that starts with the option and says how to fix it."""


_files = ExitStack()  # keeps an extracted chart alive when the package is a zip


@functools.cache
def chart_dir() -> Path:
    """The chart shipped inside the package (charts/kubeddp in a checkout)."""
    return _files.enter_context(
        importlib.resources.as_file(importlib.resources.files(CHART_PACKAGE))
    )


@functools.cache
def _schema_validator() -> Any:
    import jsonschema

    schema = json.loads((chart_dir() / "values.schema.json").read_text())
    return jsonschema.Draft7Validator(schema)


def _describe(error: Any) -> str:
    if error.validator == "pattern":
        means = patterns.meaning(error.validator_value)
        if means:
            return f"{error.instance!r} is not {means}"
    if error.validator == "enum":
        allowed = ", ".join(repr(item) for item in error.validator_value if item is not None)
        return f"{error.instance!r} is not one of {allowed}"
    if error.validator == "not":  # a value kubeddp keeps for itself
        taken = error.validator_value
        means = patterns.meaning(taken.get("pattern", ""))
        if means:
            return f"{error.instance!r} is {means}"
        if "enum" in taken:
            names = ", ".join(repr(item) for item in taken["enum"])
            return f"{error.instance!r} is taken by kubeddp ({names}); choose another"
    if error.validator == "maxLength":
        shown = error.instance if len(error.instance) <= 80 else error.instance[:60] + "..."
        return (
            f"{shown!r} ({len(error.instance)} characters) is longer than the limit of "
            f"{error.validator_value}"
        )
    return error.message


def check_values(values: dict[str, Any], provenance: Provenance) -> None:
    """The chart's schema, as Helm would apply it, on the chart's defaults plus `values`."""
    import jsonschema

    merged = helm_engine.merge_values(helm_engine.chart_defaults(chart_dir()), values)
    error = jsonschema.exceptions.best_match(_schema_validator().iter_errors(merged))
    if error is not None:
        path = ".".join(str(part) for part in error.absolute_path)
        raise RenderError(f"{option_for(path, provenance)}: {_describe(error)}")


def _helm_error(exc: Exception, provenance: Provenance) -> RenderError:
    text = str(exc)
    found = _FAIL.search(text)
    message = " ".join((found.group(1) if found else text).split())  # one line
    name = _VALUE_NAME.search(message)
    option = option_for(name.group(1), provenance) if name else "render"
    return RenderError(f"{option}: {message.replace('`', '')}")


def _test_hook(doc: dict) -> bool:
    hook = ((doc.get("metadata") or {}).get("annotations") or {}).get(HOOK_ANNOTATION)
    return hook is not None and {e.strip() for e in str(hook).split(",")} <= TEST_HOOKS


def _apply_order(doc: dict) -> int:
    key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    first = [resource.key for resource in APPLY_FIRST]
    if key in first:
        return first.index(key)
    if key in [resource.key for resource in APPLY_LAST]:
        return len(first) + 1
    return len(first)


def render_documents(
    values: dict[str, Any], provenance: Provenance | None = None, notes: list[str] | None = None
) -> list[dict]:
    """The job's objects in apply order; RenderError for bad values. `notes` gets the lines
    that say which storage the job uses and what the cluster must offer, and what its
    network.fabric requests and which Pod Security level its pods need."""
    provenance = provenance or {}
    check_values(values, provenance)
    try:
        rendered = helm_engine.render(
            chart_dir(),
            values,
            name=values["fullnameOverride"],
            namespace=values.get("namespaceOverride") or None,
        )
    except helm_engine.HelmFailed as exc:
        raise _helm_error(exc, provenance) from None
    try:
        docs = [
            doc
            for path, text in sorted(rendered.items())
            if path.endswith((".yaml", ".yml"))
            for doc in yaml_io.load_all(text, f"the rendered {path}")
            if doc and not _test_hook(doc)
        ]
    except yaml_io.YamlInputError as exc:  # values that make the output too deep or too large
        raise RenderError(f"render: {exc}") from None
    if notes is not None:  # `helm template` renders no NOTES: the job object carries the line
        notes += [
            line
            for doc in docs
            for annotation in (CHECKPOINTS_ANNOTATION, NETWORK_ANNOTATION)
            if (line := ((doc.get("metadata") or {}).get("annotations") or {}).get(annotation))
        ]
    return sorted(docs, key=_apply_order)


# --- output -----------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block style, except long integer lists (exit codes) stay on a few lines; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = len(data) > 8 and all(isinstance(item, int) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None  # the config file stays readable in the ConfigMap
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)


def to_yaml(docs: list[dict]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def to_json(docs: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2) + "\n"
