"""The Helm chart as the tests render it: through helm-python-sdk (Helm v4's Go library), as
release `demo` in namespace `ml`, with the chart's defaults or one of its ci/ values files."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubeddp"
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
RELEASE = "demo"
NAMESPACE = "ml"


@functools.cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def ci_values(path: Path) -> dict[str, Any]:
    return helm.values_from_yaml(path.read_text())  # what `helm -f FILE` reads


def render(values: dict[str, Any]) -> list[dict]:
    """The release's objects (NOTES.txt and empty templates dropped), hooks included."""
    rendered = chart().render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs
