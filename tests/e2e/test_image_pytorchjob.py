"""A PyTorchJob (2 Workers, kubeddp's default shape) played by two containers of the CPU image.

`kubeddp render pytorchjob` makes the manifest; the operator's env and labels for each pod come
from the independent model in tests/emulation/operator_env.py (its table of what Training
Operator v1.9 injects); each pod becomes a `docker run` named like the pod, on an `--internal`
network where pod names resolve as the operator's per-pod Services make them resolve. The
checkpoint claim is a host directory both containers mount.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import dockerenv
import pytest

sys.path.insert(0, str(dockerenv.REPO / "tests" / "emulation"))

from operator_env import (  # noqa: E402
    JobPlan,
    PodPlan,
    container_env,
    expand,
    load_documents,
    plan_from_documents,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

QUICK = ["workload.name=regression", "train.max_steps=20", "train.log_every=5"]
WORKER_WAIT_SECONDS = 120  # until the first-started worker says it waits


def render(name: str, image: str, nproc: str, *options: str) -> JobPlan:
    kubeddp = Path(sys.executable).parent / "kubeddp"
    # The claim mounted in every pod (a host directory here), not the default checkpoint
    # keeper: that one is played by the emulator's Deployment pods (tests/emulation).
    cmd = [str(kubeddp), "render", "pytorchjob", "--name", name, "--nodes", "2",
           "--nproc-per-node", nproc, "--image", image, "--checkpoint-storage", "mount",
           *options, "--validate-against", "offline"]  # fmt: skip
    for item in QUICK:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return plan_from_documents(load_documents(proc.stdout))


def _docker_size(quantity: str) -> str:
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity)
    assert match, f"size {quantity!r} is not emulated"
    return match.group(1) + {"Ki": "k", "Mi": "m", "Gi": "g", None: "b"}[match.group(2)]


def pod_options(pod: PodPlan, plan: JobPlan, workdir: Path) -> list[str]:
    """`docker run` options for the pod's securityContext and volumes, as the kubelet mounts."""
    container = pod.container
    assert "command" not in container, "the image's ENTRYPOINT must run: no command override"
    ctx: dict[str, Any] = container.get("securityContext", {})
    options: list[str] = []
    if ctx.get("runAsUser") is not None:
        options += ["--user", f"{ctx['runAsUser']}:{ctx.get('runAsGroup', ctx['runAsUser'])}"]
    if ctx.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    for cap in ctx.get("capabilities", {}).get("drop", []):
        options += ["--cap-drop", cap]
    if ctx.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    volumes = {v["name"]: v for v in pod.volumes}
    for mount in container.get("volumeMounts", []):
        volume, path = volumes[mount["name"]], mount["mountPath"]
        if "configMap" in volume:
            host = workdir / pod.name / mount["name"]
            host.mkdir(parents=True)
            for key, text in plan.configmaps[volume["configMap"]["name"]].items():
                (host / key).write_text(text)
                (host / key).chmod(0o644)
            host.chmod(0o755)
            options += ["-v", f"{host}:{path}:ro"]
        elif volume.get("emptyDir", {}).get("medium") == "Memory" and path == "/dev/shm":
            options += ["--shm-size", _docker_size(volume["emptyDir"].get("sizeLimit", "64Mi"))]
        elif "emptyDir" in volume:
            options += ["--tmpfs", f"{path}:rw,exec,mode=1777"]
        elif "persistentVolumeClaim" in volume:  # one directory for every pod of the job
            host = workdir / f"claim-{volume['persistentVolumeClaim']['claimName']}"
            host.mkdir(exist_ok=True)
            host.chmod(0o777)
            options += ["-v", f"{host}:{path}"]
        else:
            pytest.fail(f"volume {volume} is not emulated")
    return options


def start_pod(docker: dockerenv.DockerRun, plan: JobPlan, pod: PodPlan, network: str,
              workdir: Path) -> str:  # fmt: skip
    env = container_env(pod, namespace="default", pod_ip="")
    args = [expand(a, env) for a in pod.container.get("args", [])]
    options = pod_options(pod, plan, workdir)
    return docker.start(pod.name, args, network=network, env=env, options=options)


def _job_name(docker: dockerenv.DockerRun, what: str) -> str:
    return f"{docker.prefix}-{what}"


def run_job(docker: dockerenv.DockerRun, tmp_path: Path, what: str, nproc: str,
            worker_first: bool = False) -> tuple[int, int, str, str]:  # fmt: skip
    plan = render(_job_name(docker, what), docker.image, nproc)
    assert [p.replica_type for p in plan.pods] == ["Worker", "Worker"], plan.pods
    master, worker = plan.pods  # worker-0 is rank 0 and hosts the rendezvous
    network = docker.network()
    if worker_first:
        start_pod(docker, plan, worker, network, tmp_path)
        # it says it waits for worker-0's name, which does not exist yet
        docker.wait_for_log(worker.name, "[kubeddp] waiting up to", WORKER_WAIT_SECONDS)
        state = dockerenv.sh("docker", "inspect", "-f", "{{.State.Running}}", worker.name)
        assert state.stdout.strip() == "true", docker.logs(worker.name)[-4000:]
        start_pod(docker, plan, master, network, tmp_path)
    else:
        start_pod(docker, plan, master, network, tmp_path)
        start_pod(docker, plan, worker, network, tmp_path)
    master_code = docker.wait(master.name, timeout=420)
    worker_code = docker.wait(worker.name, timeout=120)
    return master_code, worker_code, docker.logs(master.name), docker.logs(worker.name)


def _assert_job_succeeded(result: tuple[int, int, str, str], world_size: int) -> None:
    master_code, worker_code, master_log, worker_log = result
    assert master_code == 0, master_log[-4000:]
    assert worker_code == 0, worker_log[-4000:]
    dockerenv.TrainingLog.parse(master_log).assert_trained(world_size=world_size)


@pytest.mark.timeout(1800)  # may build the image first
def test_master_and_worker_train_with_gloo(docker: dockerenv.DockerRun, tmp_path: Path) -> None:
    _assert_job_succeeded(run_job(docker, tmp_path, "pj1", nproc="1"), world_size=2)


@pytest.mark.timeout(900)
def test_two_processes_per_pod(docker: dockerenv.DockerRun, tmp_path: Path) -> None:
    """nprocPerNode 2: two workers per pod (the operator's PET_NPROC_PER_NODE), world size 4."""
    _assert_job_succeeded(run_job(docker, tmp_path, "pj2", nproc="2"), world_size=4)


@pytest.mark.timeout(900)
def test_worker_started_before_master_exists(docker: dockerenv.DockerRun, tmp_path: Path) -> None:
    """worker-1 starts first; launch waits for worker-0's DNS name, then trains."""
    result = run_job(docker, tmp_path, "pjw", nproc="1", worker_first=True)
    _assert_job_succeeded(result, world_size=2)


def test_operator_env_matches_the_matrix(tmp_path: Path) -> None:
    """The env given to the containers is what the CSV says the operator injects."""
    plan = render("envcheck", "kubeddp:e2e-cpu", "2", "--master-replica")
    assert [p.replica_type for p in plan.pods] == ["Master", "Worker"], plan.pods
    master, worker = (container_env(p, "default", "") for p in plan.pods)
    for env, rank in ((master, "0"), (worker, "1")):
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "envcheck-master-0"
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "23456"
        assert env["WORLD_SIZE"] == "4"
        assert env["RANK"] == env["PET_NODE_RANK"] == rank
        assert env["PET_NNODES"] == "2"
        assert env["PET_NPROC_PER_NODE"] == "2"
        assert env["PYTHONUNBUFFERED"] == "1"
    assert os.path.basename(plan.pods[0].container["name"]) == "pytorch"
