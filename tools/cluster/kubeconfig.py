"""Several kubeconfig files in $KUBECONFIG, merged as kubectl merges them: the first file that
names a cluster, user or context wins it; current-context comes from the first file that sets
one; relative certificate and token paths stay relative to the file that holds them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kubeddp.trainer import yaml_io

NAMED = ("clusters", "users", "contexts")
# Fields that name a file; kubectl resolves them against the kubeconfig that holds them.
FILE_FIELDS = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
}


class KubeconfigError(ValueError):
    """A kubeconfig file that cannot be read or is not a kubeconfig: one line."""


def paths_from_env(value: str) -> list[str]:
    """$KUBECONFIG's files, in order, empty entries dropped (as kubectl does)."""
    return [part for part in value.split(os.pathsep) if part]


def read(path: str) -> dict[str, Any]:
    try:
        data = yaml_io.load_file(path, f"kubeconfig {path}")
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {path} ({exc.strerror or exc})") from None
    except yaml_io.YamlInputError as exc:
        raise KubeconfigError(f"{exc}; fix it or pass --kubeconfig") from None
    if not isinstance(data, dict):
        raise KubeconfigError(
            f"kubeconfig {path} is not a kubeconfig (a YAML mapping with clusters, users and "
            "contexts); fix it or pass --kubeconfig"
        )
    return data


def _absolute(entry: Any, section: str, base: Path) -> Any:
    if section not in FILE_FIELDS or not isinstance(entry, dict):
        return entry
    inner_key, fields = FILE_FIELDS[section]
    inner = entry.get(inner_key)
    if not isinstance(inner, dict):
        return entry
    fixed = {
        key: str(base / value) if key in fields and isinstance(value, str) and value else value
        for key, value in inner.items()
    }
    return {**entry, inner_key: fixed}


def merge(paths: list[str]) -> dict[str, Any]:
    """One kubeconfig from the files that exist among `paths` (first wins, as kubectl)."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    merged.update({section: [] for section in NAMED})
    for path in paths:
        if not Path(path).is_file():
            continue  # kubectl skips missing files in the list
        data = read(path)
        base = Path(path).resolve().parent
        if data.get("current-context") and not merged.get("current-context"):
            merged["current-context"] = data["current-context"]
        for section in NAMED:
            entries = data.get(section) or []
            if not isinstance(entries, list):
                raise KubeconfigError(f"kubeconfig {path}: {section} must be a list; fix it")
            taken = {entry.get("name") for entry in merged[section]}
            for entry in entries:
                if isinstance(entry, dict) and entry.get("name") not in taken:
                    merged[section].append(_absolute(entry, section, base))
                    taken.add(entry.get("name"))
    return merged
