"""Retries that end, and recovery that costs one pod: rendered jobs under the emulated operators,
with real processes (one network namespace per pod).

- A worker OOM-killed at every start: under PyTorchJob ExitCode the operator would recreate the
  pod forever (137 >= 128, never counted against backoffLimit); launch's own budget ends it
  with a fatal code, and `kubeddp status` shows why.
- One preempted pod of an 8-node TrainJob (kubeddp's TrainingRuntime) and of a 32-pod Indexed
  Job: the peers stay up and rejoin, only the preempted pod is recreated (after the Job
  controller's back-off for one failure), and training resumes from the checkpoint.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster import EmulatedCluster
from rendered_jobs import (
    BUDGET,
    JOB_SECONDS,
    OOM_IMAGE_SCRIPT,
    OOM_SCRIPT,
    TINY,
    assert_trained,
    exits,
    first_complete_checkpoint,
    render,
    slow_steps,
)

from kubeddp.tools.cli.main import main
from kubeddp.trainer import exit_codes
from tests.helpers import fake_api

pytestmark = [pytest.mark.netns, pytest.mark.slow]

# Long enough to preempt a pod while the job trains, short enough for 2 shared cores.
STEPS = ["--set", "train.max_steps=60", "--set", "train.epochs=20", "--set",
         "checkpoint.every_steps=10"]  # fmt: skip
REJOINED = "this pod stays up and rejoins the rendezvous"


def kubeddp_status(cluster: EmulatedCluster, kind: str, resource: str, name: str,
                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> str:  # fmt: skip
    """`kubeddp status` against an API server that serves the emulated job and its pods."""
    ns = fake_api.NAMESPACE
    with fake_api.running() as api:
        # what the emulated controllers record: conditions (and a TrainJob's trainerStatus)
        job = {**cluster.job_object(), "apiVersion": resource.removeprefix("/apis/")}
        assert (job["kind"], job["metadata"]["name"]) == (kind, name)
        pods = {"kind": "PodList", "apiVersion": "v1", "items": cluster.pod_objects()}
        api.route("GET", f"{resource}/namespaces/{ns}/{kind.lower()}s/{name}", 200, job)
        api.route("GET", f"/api/v1/namespaces/{ns}/pods", 200, pods)
        monkeypatch.setenv("KUBECONFIG", str(fake_api.write_kubeconfig(tmp_path / "kc", api.url)))
        capsys.readouterr()
        code = main(["status", name])
        out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_a_worker_oom_killed_at_every_start_ends_the_job_within_the_budget(
    cluster_factory: Callable[..., EmulatedCluster],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    budget = f"retries.without_progress={BUDGET}"
    plan = render("pytorchjob", "--name", "oom", "--nodes", "1", "--nproc-per-node", "2",
                  "--script", OOM_IMAGE_SCRIPT, "--set", budget)  # fmt: skip
    assert plan.restart_policy == {"Worker": "ExitCode"}
    cluster = cluster_factory(image_files={OOM_IMAGE_SCRIPT: OOM_SCRIPT})
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Failed", f"{status}\n{cluster.log_tails()}"
    # The pod's own 137 each time (not 201, not a preemption's 143), recreated by the operator
    # without counting; the start after BUDGET restarts refuses with the fatal code.
    codes = [code for _, code in exits(cluster)]
    assert codes == [exit_codes.KILLED] * (BUDGET + 1) + [exit_codes.RETRIES_EXHAUSTED], codes
    out = kubeddp_status(cluster, "PyTorchJob", "/apis/kubeflow.org/v1", "oom", tmp_path,
                         monkeypatch, capsys)  # fmt: skip
    assert "PyTorchJob team/oom: Failed" in out, out
    line = next(x for x in out.splitlines() if "exit 5:" in x)
    assert f"retries exhausted: {BUDGET + 1} restarts of pod oom-worker-0" in line, out
    assert "last failure: workers failed: exit code 137 (killed, retryable)" in line, out


def rejoined_peers(cluster: EmulatedCluster, lost: str) -> set[str]:
    return {name for name in cluster.pods if name != lost and REJOINED in cluster.logs(name)}


def assert_one_pod_recovery(cluster: EmulatedCluster, lost: str) -> None:
    """Only the lost pod failed and was recreated (once); every peer stayed up and rejoined."""
    failed = [(pod, code) for pod, code in exits(cluster) if code != 0]
    assert failed == [(lost, exit_codes.PREEMPTED)], f"{failed}\n{cluster.log_tails()}"
    assert cluster.status.counters.failed == 0, cluster.status.events
    job_pods = {n for n, r in cluster.pods.items() if r.plan.replica_type != "Deployment"}
    recreated = {name: len(times) - 1 for name, times in cluster.created_at.items()}
    recreated = {name: count for name, count in recreated.items() if name in job_pods}
    assert recreated == {name: int(name == lost) for name in job_pods}, recreated
    assert rejoined_peers(cluster, lost) == job_pods - {lost}  # the keeper pod aside
    resumed = re.findall(r"resumed from \S+ \(step (\d+)", cluster.all_logs())
    assert resumed and int(resumed[-1]) > 0, cluster.log_tails()


@pytest.mark.timeout(3 * JOB_SECONDS)
def test_trainjob_of_eight_nodes_survives_a_preempted_pod(cluster: EmulatedCluster) -> None:
    plan = render("trainjob", "--name", "tj", "--nodes", "8", "--nproc-per-node", "1",
                  *TINY, *STEPS, *slow_steps(150))  # fmt: skip
    assert plan.restart_policy == {"node": "Never"} and plan.jobset_failure_policy is not None
    cluster.start(plan)
    first_complete_checkpoint(cluster)
    cluster.preempt_pod("tj-node-0-5", grace_seconds=60)
    status = cluster.wait_finished(2 * JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert status.counters.jobset_restarts == 0, status.events
    assert_one_pod_recovery(cluster, "tj-node-0-5")
    assert_trained(cluster, world_size=8)


# Alone: beside other tests on 2 cores, 32 pods' gloo connects once met 'No route to host' on
# the emulated bridge, and the ranks that were not told waited out the 600 s rejoin round.
@pytest.mark.alone
@pytest.mark.timeout(7 * JOB_SECONDS)
def test_indexed_job_of_32_pods_survives_a_preempted_pod(cluster: EmulatedCluster) -> None:
    # 30 steps, not STEPS' 60: each step of 32 ranks costs every rank ~70 ms of CPU here (a
    # 32-way ring on 2 cores), and 20 steps after the resume show it as well as 50.
    plan = render("indexedjob", "--name", "ix", "--nodes", "32", "--nproc-per-node", "1",
                  *TINY, *STEPS, "--set", "train.max_steps=30",
                  "--set", "workload.samples=8192")  # fmt: skip
    cluster.start(plan)
    # 32 pods import torch and meet on 2 shared cores: minutes before the first checkpoint
    first_complete_checkpoint(cluster, 3 * JOB_SECONDS)
    cluster.preempt_pod("ix-7", grace_seconds=60)
    status = cluster.wait_finished(3 * JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert_one_pod_recovery(cluster, "ix-7")
    assert_trained(cluster, world_size=32)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-x"]))
