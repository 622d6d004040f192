"""One version for every artifact, and a release workflow that publishes what the chart and
the README point at: the images at ghcr.io/kubeddp/kubeddp:VERSION (CUDA), :VERSION-efa and
:VERSION-cpu, the chart at the same version, the wheel on PyPI; `helm package` makes
kubeddp-VERSION.tgz."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from kubeddp.trainer import __version__
from tests.helpers import helm_cli

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
VALUES = yaml.safe_load((REPO / "charts" / "kubeddp" / "values.yaml").read_text())
CHECK = [sys.executable, str(REPO / ".ci" / "release_version.py")]

pytestmark = pytest.mark.timeout(120)


def test_every_artifact_carries_one_version() -> None:
    done = subprocess.run(CHECK, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == __version__


def test_a_tag_of_another_version_stops_the_release() -> None:
    done = subprocess.run([*CHECK, "v99.0.0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 5 and all(line.endswith("not 99.0.0") for line in lines), lines


def test_the_chart_defaults_to_the_image_the_workflow_pushes() -> None:
    assert VALUES["image"]["repository"] == WORKFLOW["env"]["IMAGE"]
    assert VALUES["image"]["tag"] == ""  # = appVersion = the release's version
    matrix = WORKFLOW["jobs"]["images"]["strategy"]["matrix"]["include"]
    shapes = {row["variant"]: (row["platforms"], row["suffix"]) for row in matrix}
    assert shapes == {
        "cuda": ("linux/amd64", ""),
        "efa": ("linux/amd64", "-efa"),
        "cpu": ("linux/amd64,linux/arm64", "-cpu"),
    }
    makefile = (REPO / "Makefile").read_text()
    assert f"IMAGE ?= {WORKFLOW['env']['IMAGE']}" in makefile
    assert "-t $(IMAGE):$(VERSION) ." in makefile and "-t $(IMAGE):$(VERSION)-cpu" in makefile


def _step(job: str, uses: str) -> dict:
    (step,) = [s for s in WORKFLOW["jobs"][job]["steps"] if s.get("uses", "").startswith(uses)]
    return step


def test_the_workflow_attests_signs_and_publishes_without_stored_secrets() -> None:
    assert WORKFLOW["on"]["push"]["tags"]
    build = _step("images", "docker/build-push-action")["with"]
    assert build["push"] is True and build["sbom"] is True and "mode=max" in build["provenance"]
    assert "VERSION=${{ env.VERSION }}" in build["build-args"]
    runs = " ".join(s.get("run", "") for s in WORKFLOW["jobs"]["images"]["steps"])
    assert "cosign sign --yes" in runs
    assert WORKFLOW["jobs"]["images"]["permissions"]["id-token"] == "write"
    chart = " ".join(s.get("run", "") for s in WORKFLOW["jobs"]["chart"]["steps"])
    assert "helm push" in chart and "${CHARTS}" in chart
    assert WORKFLOW["jobs"]["pypi"]["permissions"] == {"id-token": "write"}
    publish = _step("pypi", "pypa/gh-action-pypi-publish")
    assert "password" not in publish.get("with", {})  # trusted publishing, no token


def test_helm_package_makes_the_release_chart(tmp_path: Path) -> None:
    helm = helm_cli.require(helm_cli.HELM_3_OLDEST, "helm")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(helm), "package", str(REPO / "charts" / "kubeddp"), "--destination", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    archive = tmp_path / f"kubeddp-{__version__}.tgz"
    with tarfile.open(archive) as chart:
        meta = yaml.safe_load(chart.extractfile("kubeddp/Chart.yaml").read())
        names = chart.getnames()
    assert (meta["version"], meta["appVersion"]) == (__version__, __version__)
    assert not any(name.startswith("kubeddp/ci/") for name in names)  # .helmignore


def test_readme_pulls_this_version() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"docker pull ghcr.io/kubeddp/kubeddp:{__version__} " in readme
    assert f"docker pull ghcr.io/kubeddp/kubeddp:{__version__}-cpu " in readme
    assert f"oci://ghcr.io/kubeddp/charts/kubeddp --version {__version__} " in readme
