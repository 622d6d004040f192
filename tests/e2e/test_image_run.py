"""`docker run` of the CPU image, as a user or a hardened pod would run it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import dockerenv
import pytest

from kubeddp.tools.manifests import k8s_names
from kubeddp.trainer import constants

pytestmark = [pytest.mark.docker, pytest.mark.slow]

QUICK = ["--set", "workload.name=regression", "--set", "train.max_steps=20"]
# What the README (The container image) promises works with a read-only root filesystem.
HARDENED = [
    "--user", f"{k8s_names.IMAGE_UID}:{k8s_names.IMAGE_UID}",
    "--read-only",
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
    "--tmpfs", f"{constants.SCRATCH_DIR}:rw,exec,mode=1777,size=512m",
    "--shm-size", "256m",
]  # fmt: skip


def _checkpoint_volume(tmp_path: Path) -> Path:
    """A host directory the image's user owns, as a PVC with fsGroup would be."""
    host_dir = tmp_path / "checkpoints"
    host_dir.mkdir()
    os.chown(host_dir, k8s_names.IMAGE_UID, k8s_names.IMAGE_UID)
    return host_dir


def _complete_checkpoints(host_dir: Path) -> list[Path]:
    return sorted(p for p in host_dir.glob("ckpt-*") if (p / "COMPLETE").exists())


@pytest.mark.timeout(1800)  # may build the image first
def test_bare_run_trains_with_two_workers(docker: dockerenv.DockerRun) -> None:
    """No rendezvous env: torchrun standalone, KUBEDDP_CPU_NPROC=2 gloo workers, exit 0.

    The network is a user-defined one, like Docker's default bridge: the container's hostname
    resolves, which torchrun's standalone store needs.
    """
    name = docker.start(f"{docker.prefix}-bare", ["--", *QUICK], network=docker.network())
    code = docker.wait(name, timeout=300)
    log = dockerenv.TrainingLog.parse(docker.logs(name))
    assert code == 0, log.text[-4000:]
    log.assert_trained(world_size=2)


@pytest.mark.timeout(300)
def test_run_without_any_network(docker: dockerenv.DockerRun) -> None:
    """`docker run --network none`: one node needs no network beyond loopback."""
    name = docker.start(f"{docker.prefix}-nonet", ["--", *QUICK], options=["--network", "none"])
    code = docker.wait(name, timeout=120)  # a healthy run takes ~20 s; broken ones hang 600 s
    log = dockerenv.TrainingLog.parse(docker.logs(name))
    assert code == 0, log.text[-4000:]
    log.assert_trained(world_size=2)


@pytest.mark.timeout(600)
def test_hardened_run_with_config_file_and_checkpoint_volume(
    docker: dockerenv.DockerRun, tmp_path: Path
) -> None:
    """UID 1000, read-only root, no capabilities, no privilege gain; writes only to the mounts."""
    host_ckpt = _checkpoint_volume(tmp_path)
    config = tmp_path / "my.yaml"
    config.write_text(
        f"checkpoint:\n  dir: {constants.CHECKPOINT_DIR}\n  every_steps: 10\n"
        "train:\n  log_every: 5\n"
    )
    config.chmod(0o644)
    options = [
        *HARDENED,
        "-v", f"{config}:{constants.CONFIG_FILE}:ro",
        "-v", f"{host_ckpt}:{constants.CHECKPOINT_DIR}",
    ]  # fmt: skip
    args = ["--", "--config", constants.CONFIG_FILE, *QUICK]
    name = docker.start(f"{docker.prefix}-hard", args, network=docker.network(), options=options)
    code = docker.wait(name, timeout=300)
    log = dockerenv.TrainingLog.parse(docker.logs(name))
    assert code == 0, log.text[-4000:]
    log.assert_trained(world_size=2)
    saved = _complete_checkpoints(host_ckpt)
    assert saved, f"no complete checkpoint in {host_ckpt}: {list(host_ckpt.iterdir())}"
    assert all(p.stat().st_uid == k8s_names.IMAGE_UID for p in saved), "not written by UID 1000"


@pytest.mark.timeout(600)
def test_docker_stop_saves_a_checkpoint_and_exits_retryable(
    docker: dockerenv.DockerRun, tmp_path: Path
) -> None:
    """SIGTERM via tini reaches torchrun and the workers: a checkpoint, then exit >= 128."""
    host_ckpt = _checkpoint_volume(tmp_path)
    args = [
        "--",
        "--set", "workload.name=regression",
        "--set", "train.epochs=100000",
        "--set", "train.log_every=10",
        "--set", f"checkpoint.dir={constants.CHECKPOINT_DIR}",
    ]  # fmt: skip
    options = [*HARDENED, "-v", f"{host_ckpt}:{constants.CHECKPOINT_DIR}"]
    name = docker.start(f"{docker.prefix}-stop", args, network=docker.network(), options=options)
    docker.wait_for_log(name, "step 10/", timeout=240)
    grace = k8s_names.TERMINATION_GRACE_PERIOD_SECONDS
    dockerenv.sh("docker", "stop", "--time", str(grace), name, timeout=grace + 60)
    code = docker.wait(name, timeout=60)
    text = docker.logs(name)
    if code == 137:  # docker had to SIGKILL: the signal did not end the run in time
        pytest.fail(f"SIGTERM did not stop the container within {grace}s:\n{text[-4000:]}")
    assert code >= 128, f"exit code {code} is not retryable under restartPolicy ExitCode"
    # Epoch ends save too, so only the step named in the SIGTERM message proves the save.
    said = re.search(r"SIGTERM: saving a checkpoint at step (\d+)", text)
    assert said, f"no preemption save announced:\n{text[-4000:]}"
    step_dir = host_ckpt / f"ckpt-{int(said.group(1)):08d}"
    assert step_dir in _complete_checkpoints(host_ckpt), f"{step_dir} missing:\n{text[-4000:]}"


@pytest.mark.timeout(300)
def test_compile_on_in_the_cpu_image_is_refused_in_one_line(docker: dockerenv.DockerRun) -> None:
    """The CPU image has no C++ compiler, which inductor needs: train.compile=on ends at once
    with exit 2 and one line, not with an inductor traceback per worker at the first step."""
    args = ["--", *QUICK, "--set", "train.compile=on"]
    name = docker.start(f"{docker.prefix}-compile", args, options=["--network", "none"])
    code = docker.wait(name, timeout=120)
    text = docker.logs(name)
    errors = [line for line in text.splitlines() if "error" in line]
    assert code == 2, text[-4000:]
    assert errors == [
        "kubeddp launch: error: train.compile=on needs a C++ compiler for inductor (g++ on "
        "PATH, or $CXX); install it in the image or set train.compile=off (or auto, which then "
        "trains eagerly)"
    ], text[-4000:]
    assert "Traceback" not in text
