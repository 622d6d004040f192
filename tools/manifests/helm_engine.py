"""Run the chart through Helm: the `helm` binary on PATH, else the helm-python-sdk library.

Most users have `helm` already; the library (243 MiB, wheels for a few platforms only) is the
optional `helm` extra. `$KUBEDDP_HELM` chooses: a path to a helm binary, or `library`.
tests/unit/test_helm_engine.py proves both give the same objects.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

ENV = "KUBEDDP_HELM"
LIBRARY = "library"
HELM_TIMEOUT = 120  # seconds for one `helm template`
INSTALL_HELM = (
    "install the helm binary (3.16 or later: https://helm.sh/docs/intro/install/) and put it "
    "on PATH, or: pip install 'kubeddp[helm]'"
)
_SOURCE = "# Source: "
_HINTS = ("Use --debug",)  # helm's advice about its own flags, not about kubeddp's options


class HelmUnavailable(RuntimeError):
    """Neither a helm binary nor the library can run here: one line saying what to install."""


class HelmFailed(ValueError):
    """Helm refused the values (a `fail` rule, a schema error): Helm's own message."""


def merge_values(defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values over the chart's: maps merge key by key, anything else
    replaces, and a null removes a key the chart has (how `--set key=null` deletes a default;
    a null default is no key either)."""
    merged = _without_nulls(defaults)
    for key, value in values.items():
        if value is None and key in defaults:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_values(merged[key], value)
        else:  # a key the chart does not have is kept as given, nulls too (as Helm does)
            merged[key] = copy.deepcopy(value)
    return merged


def _without_nulls(tree: dict[str, Any]) -> dict[str, Any]:
    return {
        key: _without_nulls(value) if isinstance(value, dict) else copy.deepcopy(value)
        for key, value in tree.items()
        if value is not None
    }


def _binary() -> str | None:
    chosen = os.environ.get(ENV, "")
    if chosen == LIBRARY:
        return None
    if chosen:
        if not (Path(chosen).is_file() and os.access(chosen, os.X_OK)):
            raise HelmUnavailable(f"${ENV}={chosen} is not an executable file; {INSTALL_HELM}")
        return chosen
    return shutil.which("helm")


def backend() -> str:
    """What renders here: the helm binary's path, or `library`; HelmUnavailable if nothing."""
    binary = _binary()
    if binary:
        return binary
    _library_chart_loader()  # raises HelmUnavailable when the library cannot load
    return LIBRARY


@functools.cache
def _library_chart_loader() -> Any:
    try:
        # helm_python, the `helm` extra: optional (the helm binary is used without it)
        import helm_python
    except ImportError:
        raise HelmUnavailable(f"no helm binary on PATH; {INSTALL_HELM}") from None
    except Exception as exc:  # noqa: BLE001 - its native library is missing for this platform
        raise HelmUnavailable(
            f"no helm binary on PATH, and helm-python-sdk cannot load here "
            f"({type(exc).__name__}); install the helm binary: "
            "https://helm.sh/docs/intro/install/"
        ) from None
    return helm_python


def _render_library(chart: Path, values: dict, name: str, namespace: str | None) -> dict[str, str]:
    helm = _library_chart_loader()
    try:
        loaded = helm.Chart.load(chart)
        return loaded.render(values, name=name, namespace=namespace, is_install=True)
    except helm.HelmError as exc:
        raise HelmFailed(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - e.g. HelmLibraryError: no usable native library
        if type(exc).__module__.startswith("helm_python"):
            raise HelmUnavailable(
                f"helm-python-sdk cannot run here ({type(exc).__name__}); {INSTALL_HELM}"
            ) from None
        raise


def _split_sources(text: str) -> dict[str, str]:
    """`helm template` output -> {template path: its documents}, as the library returns."""
    out: dict[str, str] = {}
    for part in text.split("\n---\n"):
        part = part.removeprefix("---\n")
        first, _, rest = part.partition("\n")
        if first.startswith(_SOURCE):
            path = first[len(_SOURCE) :].strip()
            rest = rest if rest.endswith("\n") else rest + "\n"  # the split took the newline
            out[path] = f"{out[path]}---\n{rest}" if path in out else rest
    return out


def _render_binary(
    binary: str, chart: Path, values: dict, name: str, namespace: str | None
) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="kubeddp-helm-") as scratch:
        values_file = Path(scratch) / "values.json"  # JSON is YAML: no quoting surprises
        values_file.write_text(json.dumps(values))
        command = [binary, "template", name, str(chart), "-f", str(values_file)]
        # Without --namespace, helm would take the kubeconfig context's namespace.
        command += ["--namespace", namespace or "default"]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=HELM_TIMEOUT, check=False
            )
        except OSError as exc:
            raise HelmUnavailable(f"cannot run {binary} ({exc.strerror}); {INSTALL_HELM}") from None
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if not line.startswith(_HINTS)]
        message = "\n".join(lines).strip().removeprefix("Error: ")
        raise HelmFailed(message or f"{binary} template exited {result.returncode}")
    return _split_sources(result.stdout)


def render(chart: Path, values: dict, name: str, namespace: str | None) -> dict[str, str]:
    """{template path: rendered text} for an install of `chart` named `name`."""
    binary = _binary()
    if binary:
        return _render_binary(binary, chart, values, name, namespace)
    return _render_library(chart, values, name, namespace)


def chart_defaults(chart: Path) -> dict[str, Any]:
    return yaml.safe_load((chart / "values.yaml").read_text()) or {}
