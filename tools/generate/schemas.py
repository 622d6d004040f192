"""Generate tools/manifests/schemas/: the JSON schemas `kubeddp validate` checks offline, so the
`cli` extra needs neither kubernetes-validate (110 MiB, 13 Kubernetes versions) nor the Kubeflow
SDKs.

- core-v<K8S>.json: the strict schemas of the core kinds kubeddp renders (from
  kubernetes-validate, a dev dependency) with only the definitions they reach;
- the PyTorchJob and TrainJob CRDs' openAPIV3Schema (from tests/reference/crds, the pinned
  upstream files).

    python -m kubeddp.tools.generate.schemas    # `make chart` runs it; a test checks it is fresh
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

import yaml

from kubeddp.tools.manifests.bundled_schemas import (
    CORE_FILE,
    CORE_KINDS,
    CRD_FILES,
    KUBERNETES_SCHEMA_VERSION,
    SCHEMA_DIR,
)

REPO = Path(__file__).resolve().parents[2]
REFERENCE_CRDS = REPO / "tests" / "reference" / "crds"
# Kind files point into _definitions.json; definitions point within it.
DEFS_PREFIXES = ("/api/_definitions.json#/$defs/", "#/$defs/")


def _strip(node: Any) -> Any:
    """Only what validates: no prose (a property may be *named* description: keep mappings)."""
    if isinstance(node, dict):
        return {
            key: _strip(value)
            for key, value in node.items()
            if not (key == "description" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [_strip(item) for item in node]
    return node


def _relink(node: Any, found: list[str]) -> Any:
    """kubernetes-validate's absolute refs -> refs into this file's own $defs."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            prefix = next((p for p in DEFS_PREFIXES if str(value).startswith(p)), None)
            if key == "$ref" and isinstance(value, str) and prefix:
                name = value[len(prefix) :]
                found.append(name)
                value = "#/$defs/" + name
            out[key] = _relink(value, found)
        return out
    if isinstance(node, list):
        return [_relink(item, found) for item in node]
    return node


def core_schemas() -> dict[str, Any]:
    folder = (
        importlib.resources.files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{KUBERNETES_SCHEMA_VERSION}-local-strict"
    )
    source = json.loads((folder / "_definitions.json").read_text())["$defs"]
    kinds, wanted = {}, []
    for key, file_name in CORE_KINDS.items():
        kinds[key] = _relink(_strip(json.loads((folder / file_name).read_text())), wanted)
    defs: dict[str, Any] = {}
    while wanted:
        name = wanted.pop()
        if name not in defs:
            defs[name] = _relink(_strip(source[name]), wanted)
    return {
        "kubernetes": KUBERNETES_SCHEMA_VERSION,
        "kinds": kinds,
        "$defs": dict(sorted(defs.items())),
    }


def crd_schema(file_name: str, version: str) -> dict[str, Any]:
    crd = yaml.load(
        (REFERENCE_CRDS / file_name).read_text(),
        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
    )
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return {"source": file_name, "openAPIV3Schema": _strip(served["schema"]["openAPIV3Schema"])}


def generated() -> dict[Path, str]:
    """file -> content (compact JSON: these files are read by code, not people)."""
    out = {SCHEMA_DIR / CORE_FILE: core_schemas()}
    for _key, (bundled, source, version) in CRD_FILES.items():
        out[SCHEMA_DIR / bundled] = crd_schema(source, version)
    return {
        path: json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n"
        for path, data in out.items()
    }


def main() -> int:
    for path, text in generated().items():
        path.write_text(text)
        print(f"{path.relative_to(REPO)}: {len(text) // 1024} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
