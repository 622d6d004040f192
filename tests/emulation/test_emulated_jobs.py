"""Rendered manifests run as the operators would run them, one network namespace per pod.

Each case renders a manifest with `kubeddp render` (or the Helm chart with its CI values),
derives the pods and their env from the operator rules in operator_env.py, starts every pod's
container command in its own namespace, and lets the controllers' rules (controllers.py) decide
what a pod's end means: success, a recreated pod, a restart in place, or a failed job.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster import EmulatedCluster, EmulationError
from operator_env import INIT_CONTAINER_NAME, JobPlan, plan_from_documents
from prometheus_client.parser import text_string_to_metric_families
from rendered_jobs import (
    DONE,
    JOB_SECONDS,
    LONGER,
    REPO,
    TINY,
    assert_trained,
    exits,
    first_complete_checkpoint,
    render,
    slow_steps,
)

from kubeddp.trainer import exit_codes
from tests.helpers import checkpoints as ck
from tests.helpers import helm_install

pytestmark = [pytest.mark.netns, pytest.mark.slow]

# For exactly-once checks: 1800 training rows (2000 x 90%) split evenly over 3 or 6 ranks, every
# sample id recorded in the checkpoints; 2 epochs of 38 (3 ranks) or 19 (6 ranks) steps.
EXACTLY_ONCE = [
    "--set", "workload.name=regression",
    "--set", "workload.samples=2000",
    "--set", "train.batch_size=16",
    "--set", "train.epochs=2",
    "--set", "train.log_every=5",
    "--set", "train.eval_batches=2",
    "--set", "train.record_sample_ids=true",
    "--set", "checkpoint.every_steps=5",
    # a snapshot in each pod's memory every step: never older than the newest checkpoint, so a
    # lost pod's job resumes from a peer's memory (the auto interval depends on the machine)
    "--set", "checkpoint.memory_every_steps=1",
    "--set", "ddp.backend=gloo",
    "--set", "ddp.device=cpu",
]  # fmt: skip
TRAIN_ROWS = 1800


def render_chart(values_file: Path, release: str) -> JobPlan:
    from helm_python import Chart

    values = yaml.safe_load(values_file.read_text())
    rendered = Chart.load(REPO / "charts" / "kubeddp").render(
        values, name=release, namespace="default", is_install=True
    )
    # `helm install`: hooks and objects in Helm's order, through the API server's admission
    return plan_from_documents(helm_install.installed(rendered))


def scrape(cluster: EmulatedCluster, pod: str) -> dict[str, float]:
    """The pod's /metrics as {name: value} (unlabelled samples), fetched inside the pod network."""
    run = cluster.pods[pod]
    url = f"http://{run.ip}:8479/metrics"
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=2).read().decode())"  # noqa: E501
    done = subprocess.run(
        ["ip", "netns", "exec", cluster.bridge_ns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        return {}
    return {
        s.name: s.value
        for family in text_string_to_metric_families(done.stdout)
        for s in family.samples
        if not s.labels
    }


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_pytorchjob_with_a_master_gets_init_pytorch(cluster_factory) -> None:
    """--master-replica: the operator's init-pytorch runs before each Worker's container; in a
    namespace enforcing Pod Security `restricted` the Workers are rejected for it."""
    args = ("--name", "pt", "--nodes", "2", "--nproc-per-node", "1", "--master-replica")
    plan = render("pytorchjob", *args, *TINY, *LONGER)
    assert [p.name for p in plan.pods] == ["pt-master-0", "pt-worker-0"]
    locked = cluster_factory(pod_security="restricted")
    locked.start(plan)
    assert sorted(locked.rejected) == ["pt-worker-0"]
    assert all(f'"{INIT_CONTAINER_NAME}"' in v for v in locked.rejected["pt-worker-0"])
    assert any("FailedCreate" in e and "pt-worker-0" in e for e in locked.status.events)
    locked.close()

    cluster = cluster_factory()
    cluster.start(plan)
    # While rank 0 trains, its /metrics (scraped from the pod network) shows the job.
    metrics = cluster.run_until(
        lambda: (m := scrape(cluster, "pt-master-0")).get("kubeddp_step", 0) > 0 and m,
        JOB_SECONDS,
        "kubeddp_step > 0 on pt-master-0:8479/metrics",
    )
    assert isinstance(metrics, dict)
    assert metrics.get("kubeddp_world_size") == 2, metrics
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    worker = cluster.pods["pt-worker-0"]
    assert worker.init_exit_codes == [0], "init-pytorch found the master and ended 0"
    assert "rendezvous: pytorchjob, nodes 2, 1 workers/node" in cluster.logs("pt-worker-0")
    assert_trained(cluster, world_size=2)
    assert any(cluster.volume("pvc-").glob("ckpt-*")), "rank 0 wrote no checkpoint to the claim"


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_pytorchjob_survives_a_sigkilled_worker_and_trains_each_sample_once(
    cluster_factory,
) -> None:
    """The default PyTorchJob (3 Workers, ExitCode, checkpoints on a claim) in a namespace that
    enforces Pod Security `restricted`: a node dies under worker-1 (SIGKILL, 137), the peers'
    collectives fail (PEER_FAILED, 201) but their pods stay up and rejoin the rendezvous; the
    operator recreates worker-1 alone (not counted against backoffLimit 1), with an empty
    /dev/shm: it gets the state from a peer's memory (no checkpoint is read) and training goes on
    with each sample of each epoch trained exactly once."""
    # The kill comes while the job trains, not after its 76 steps (a few seconds bare).
    plan = render("pytorchjob", "--name", "pk", "--nodes", "3", "--nproc-per-node", "1",
                  "--backoff-limit", "1", *EXACTLY_ONCE, *slow_steps(150))  # fmt: skip
    assert [p.name for p in plan.pods] == ["pk-worker-0", "pk-worker-1", "pk-worker-2"]
    assert plan.backoff_limit == 1
    cluster = cluster_factory(pod_security="restricted")
    cluster.start(plan)
    assert cluster.rejected == {}, "Workers only: no init-pytorch, admitted by restricted"
    first_complete_checkpoint(cluster)
    cluster.kill_pod("pk-worker-1", signal.SIGKILL)
    status = cluster.wait_finished(2 * JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    ended = exits(cluster)
    failed = [(pod, code) for pod, code in ended if code != 0]
    # Only the killed pod ended; its peers rejoined (no pod recreations for them).
    assert failed == [("pk-worker-1", exit_codes.KILLED)], ended
    for peer in ("pk-worker-0", "pk-worker-2"):
        assert "stays up and rejoins the rendezvous" in cluster.logs(peer), cluster.log_tails()
        assert len(cluster.created_at[peer]) == 1
    assert "rendezvous: pytorchjob-workers, nodes 3" in cluster.logs("pk-worker-2")
    resumed = re.findall(
        r"resumed from memory://pk-worker-\d/rank-\d \(step (\d+)", cluster.all_logs()
    )
    assert resumed and int(resumed[-1]) > 0, cluster.log_tails()
    assert "received it from rank" in cluster.logs("pk-worker-1"), cluster.log_tails()
    ck.assert_each_sample_once(ck.newest_state(cluster.volume("pvc-")), TRAIN_ROWS, 2)
    assert_trained(cluster, world_size=3)


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_indexed_job_of_six_pods_survives_a_preemption(cluster) -> None:
    """One pod of six is preempted (DisruptionTarget, SIGTERM): it saves and stops, and so do
    its five peers' workers, but their pods stay up and rejoin. The pod failure policy ignores
    the one failure, the Job controller recreates that index after its back-off (10 s for one
    failed pod, not 320 s for six), and training resumes with each sample trained once."""
    # The preemption comes while the job trains, not after its 38 steps (a few seconds bare).
    plan = render("indexedjob", "--name", "ij", "--nodes", "6", "--nproc-per-node", "1",
                  *EXACTLY_ONCE, *slow_steps(300))  # fmt: skip
    assert [p.dns_names[-1] for p in plan.pods] == [f"ij-{i}.ij" for i in range(6)]
    assert plan.backoff_limit == 3
    cluster.start(plan)
    first_complete_checkpoint(cluster)
    cluster.preempt_pod("ij-2", grace_seconds=60)
    status = cluster.wait_finished(2 * JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert status.counters.failed == 0, status.events
    failed = [(pod, code) for pod, code in exits(cluster) if code != 0]
    assert failed == [("ij-2", exit_codes.PREEMPTED)], failed
    assert status.counters.failures_since_success <= 1
    assert any("ij-2: recreated in 10s (back-off)" in e for e in status.events), status.events
    assert cluster.search_logs(r"SIGTERM: saving a checkpoint at step \d+"), cluster.log_tails()
    ck.assert_each_sample_once(ck.newest_state(cluster.volume("pvc-")), TRAIN_ROWS, 2)
    assert_trained(cluster, world_size=6)


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_elastic_store_host_killed_and_recreated_resumes(cluster: EmulatedCluster) -> None:
    """worker-0 hosts the c10d store: when it dies the other agents lose the rendezvous. They
    end with PEER_FAILED (retried), not a plain 1, and the job resumes with all three pods."""
    # The kill comes while the job trains, not after its 80 steps (3 s bare; it raced once)
    plan = render(
        "pytorchjob", "--name", "el", "--elastic", "3:3", "--nodes", "3",
        "--nproc-per-node", "1", "--max-restarts", "3", *TINY, *LONGER, *slow_steps(100),
    )  # fmt: skip
    assert plan.elastic and not any(p.replica_type == "Master" for p in plan.pods)
    cluster.start(plan)
    first_complete_checkpoint(cluster)
    cluster.kill_pod("el-worker-0", signal.SIGKILL)
    cluster.run_until(lambda: cluster.status.restarts["el-worker-0"] >= 1, 60, "pod recreated")
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    failed = [(pod, code) for pod, code in exits(cluster) if code != 0]
    assert all(code is not None and code >= exit_codes.RETRYABLE_FROM for _, code in failed)
    logs = cluster.all_logs()
    resumed = re.findall(r"resumed from \S+ \(step (\d+)", logs)
    assert resumed and int(resumed[-1]) > 0, f"no resume from a checkpoint\n{cluster.log_tails()}"
    after_resume = logs[logs.rindex("resumed from") :]
    # The recreated pod is back in the group: min = max = 3, so the rendezvous waits for it
    # however slowly it starts (with 2:3 a pod that started after the last call trained in a
    # group of 2 on a loaded machine: the test then measured a start-up race, not the recovery).
    assert "| world size 3 (gloo" in after_resume, after_resume[:2000]
    recreated = [r for r in cluster.history if r.plan.name == "el-worker-0"][-1]
    assert "rendezvous: pytorchjob-elastic, nodes 3:3" in recreated.output(), recreated.tail()
    done = DONE.findall(logs)
    assert done and float(done[-1][0]) < float(done[-1][1]), f"loss did not fall: {done}"


def trainer_progress(cluster: EmulatedCluster) -> int:
    """The TrainJob's status.trainerStatus.progressPercentage as the emulated API serves it
    (-1 before any)."""
    return cluster.job_object()["status"].get("trainerStatus", {}).get("progressPercentage", -1)


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_trainjob_two_nodes_shows_its_progress_in_its_status(cluster_factory) -> None:
    """Trainer would start one process per requested CPU without numProcPerNode: kubeddp sets
    it, so 3 CPUs per node still mean the one worker per node asked for. The controller has its
    TrainJobStatus gate on: the pod of rank 0 posts progress to its status server through the
    Service name, with the projected token and CA, and the TrainJob's status.trainerStatus
    climbs while the job trains."""
    plan = render("trainjob", "--name", "tj", "--nodes", "2", "--cpu", "3", *TINY, *LONGER,
                  *slow_steps(40), "--env", "KUBEDDP_TRAINER_STATUS_SECONDS=1")  # fmt: skip
    assert [p.name for p in plan.pods] == ["tj-node-0-0", "tj-node-0-1"]
    assert "tj-node-0-0.tj" in plan.pods[0].dns_names
    # kubeddp's own TrainingRuntime: pods Never, backoffLimit 3, a JobSet failurePolicy
    assert plan.restart_policy == {"node": "Never"} and plan.backoff_limit == 3
    assert plan.jobset_failure_policy is not None
    cluster = cluster_factory(trainjob_status=True)
    cluster.start(plan)

    def under_way() -> int:
        progress = trainer_progress(cluster)
        return progress if 0 < progress < 100 else 0

    first = cluster.run_until(under_way, JOB_SECONDS, "progress under way in the TrainJob's status")
    assert isinstance(first, int)
    cluster.run_until(lambda: trainer_progress(cluster) > first, JOB_SECONDS, "more progress")
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert "rendezvous: trainjob, nodes 2, 1 workers/node" in cluster.logs("tj-node-0-1")
    assert_trained(cluster, world_size=2)
    final = cluster.job_object()["status"]["trainerStatus"]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    metrics = {m["name"]: m["value"] for m in final["metrics"]}
    assert metrics["step"] == metrics["total_steps"] == "80", metrics
    server = cluster.status_server
    assert server is not None and server.requests
    assert {(r.answered, r.pod) for r in server.requests} == {(200, "tj-node-0-0")}, "rank 0's pod"


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_chart_with_kind_ci_values(cluster: EmulatedCluster) -> None:
    """What e2e-kind.yml installs with helm: 2 pods x KUBEDDP_CPU_NPROC=2 workers."""
    plan = render_chart(REPO / "charts" / "kubeddp" / "ci" / "cpu-kind-values.yaml", "ci")
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert_trained(cluster, world_size=4)


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_failing_pod_fails_the_job(cluster: EmulatedCluster) -> None:
    """The emulation can fail: a launch error (exit 1-127) is permanent under ExitCode."""
    plan = render("pytorchjob", "--name", "bad", "--nodes", "2", "--nproc-per-node", "cpu",
                  "--env", "KUBEDDP_CPU_NPROC=two", *TINY)  # fmt: skip
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Failed", f"{status}\n{cluster.log_tails()}"
    failed = [name for name, code in exits(cluster) if code == exit_codes.BAD_INPUT]
    assert failed, cluster.log_tails()
    assert "KUBEDDP_CPU_NPROC='two'" in cluster.logs(failed[0]), cluster.log_tails()
    assert sum(cluster.status.restarts.values()) == 0, "exit 2 is not retryable"
    with pytest.raises(EmulationError, match="job Failed"):
        cluster.run_until(lambda: False, 1, "anything")


@pytest.mark.timeout(JOB_SECONDS)
def test_trainjob_pod_restarts_in_place_until_the_jobs_backoff_limit(cluster_factory) -> None:
    """On Trainer's own torch-distributed runtime (--no-own-runtime) JobSet's pods restart
    OnFailure in place (same pod, same emptyDirs); the Job fails when the restarts of its pods
    add up to its backoffLimit of 6 (not at the first failure), and with no JobSet
    failurePolicy the TrainJob fails with it."""
    # A launch that fails the same way every time (exit 2): only the restart count ends it.
    plan = render("trainjob", "--name", "tf", "--nodes", "2", "--nproc-per-node", "1",
                  "--no-own-runtime", "--env", "KUBEDDP_RDZV_WAIT_SECONDS=soon", *TINY)  # fmt: skip
    cluster = cluster_factory(restart_delay_seconds=0.2)
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS - 30)
    assert status.phase == "Failed", f"{status}\n{cluster.log_tails()}"
    assert "BackoffLimitExceeded: 6 restarts" in status.reason, status
    assert "there is no failurePolicy" in status.reason, status
    assert status.counters.restarts == 6
    job_pods = [r for r in cluster.history if r.plan.replica_type != "Deployment"]  # no keeper
    assert [r.plan.name for r in job_pods] == ["tf-node-0-0", "tf-node-0-1"], "no new pods"
    # Both pods restarted; five restarts in place, the sixth failure ends the job.
    assert sum(r.restarts for r in job_pods) == 5
    assert all(r.restarts >= 1 for r in job_pods), cluster.status.events
    assert "KUBEDDP_RDZV_WAIT_SECONDS='soon'" in cluster.logs("tf-node-0-0")
