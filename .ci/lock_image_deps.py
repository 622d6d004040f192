#!/usr/bin/env python3
"""Write requirements/image.lock: every Python package of the image except torch, pinned, with
the sha256 of each Linux wheel of that version (x86_64 and aarch64, CPython 3.11), so the
Dockerfile installs them with --require-hashes and a rebuild gets the same bytes.

What it locks: kubeddp's runtime dependencies (pyproject.toml) and the requirements of the torch
installed in this venv (its CPU build needs nothing else). torch itself, and the CUDA libraries
its CUDA build pins exactly, come from their own index by version: download.pytorch.org, where
the CPU wheels live, is not reachable from the machines this lock is made on.

    .venv/bin/python .ci/lock_image_deps.py     # needs PyPI; tests/unit/test_image_lock.py checks
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "image.lock"
PYPI = "https://pypi.org/simple"
PLATFORMS = ("x86_64", "aarch64")
PYTHON = "311"
LINUX = {"sys_platform": "linux", "platform_system": "Linux", "extra": ""}
# Extras the image carries: s3 (boto3, ~36 MiB), so `checkpoint.dir: s3://...` works in a pod.
IMAGE_EXTRAS = ("", "s3")


def wanted() -> list[Requirement]:
    # kubeddp's own requirements as installed from pyproject.toml (only IMAGE_EXTRAS' extras)
    requirements = [Requirement(text) for text in importlib.metadata.requires("kubeddp") or []]
    requirements += [Requirement(text) for text in importlib.metadata.requires("torch") or []]
    out = {}
    for req in requirements:
        if canonicalize_name(req.name) == "torch":
            continue
        if req.marker and not any(
            req.marker.evaluate({**LINUX, "platform_machine": m, "extra": extra})
            for m in PLATFORMS
            for extra in IMAGE_EXTRAS
        ):
            continue  # an extra the image leaves out, or another OS
        out.setdefault(canonicalize_name(req.name), req)
    return list(out.values())


def resolve(requirements: list[Requirement], machine: str) -> dict[str, str]:
    """name -> version pip picks for CPython 3.11 on manylinux_2_28 `machine` (no install)."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "--isolated", "install", "--quiet", "--dry-run",
             "--ignore-installed", "--only-binary=:all:", "--platform",
             f"manylinux_2_28_{machine}", "--python-version", "3.11", "--implementation", "cp",
             "--target", str(Path(scratch) / "t"), "--report", str(report),
             *[str(req).split(";")[0] for req in requirements]],
            check=True,
        )  # fmt: skip
        items = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def wheel_hashes(name: str, version: str) -> list[str]:
    request = urllib.request.Request(
        f"{PYPI}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    found = []
    for entry in files:
        if not entry["filename"].endswith(".whl"):
            continue
        _, wheel_version, _, tags = parse_wheel_filename(entry["filename"])
        if str(wheel_version) != version:
            continue
        fits = any(
            tag.interpreter in (f"cp{PYTHON}", "py3", "py2.py3")
            and tag.abi in (f"cp{PYTHON}", "abi3", "none")
            and (tag.platform == "any"
                 or ("manylinux" in tag.platform and tag.platform.endswith(PLATFORMS)))
            for tag in tags
        )  # fmt: skip
        if fits:
            found.append(entry["hashes"]["sha256"])
    if not found:
        raise SystemExit(f"no Linux wheel of {name}=={version} on {PYPI}")
    return sorted(found)


def main() -> int:
    requirements = wanted()
    versions = {machine: resolve(requirements, machine) for machine in PLATFORMS}
    if versions["x86_64"] != versions["aarch64"]:
        raise SystemExit(f"the platforms resolve differently: {versions}")
    lines = [
        "# The image's Python packages except torch, pinned with the sha256 of each Linux wheel",
        "# (CPython 3.11, x86_64 and aarch64). Made by .ci/lock_image_deps.py; the Dockerfile",
        "# installs it with --require-hashes. Edit pyproject.toml, then run the script again.",
    ]
    for name, version in sorted(versions["x86_64"].items()):
        hashes = " \\\n".join(f"    --hash=sha256:{h}" for h in wheel_hashes(name, version))
        lines.append(f"{name}=={version} \\\n{hashes}")
    LOCK.write_text("\n".join(lines) + "\n")
    print(f"{LOCK.relative_to(REPO)}: {len(versions['x86_64'])} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
