"""Rendered manifests run as the operators would run them, one network namespace per pod.

Each case renders a manifest with `kubeddp render` (or the Helm chart with its CI values),
derives the pods and their env from the operator rules in operator_env.py, starts every pod's
container command in its own namespace and decides success by the controller's rule.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster import EmulatedCluster
from operator_env import JobPlan, load_documents, plan_from_documents
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.netns, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
KUBEDDP = [sys.executable, "-m", "kubeddp"]
# A tiny regression run: a handful of gloo steps, checkpoints, an eval.
TINY = [
    "--set", "workload.name=regression",
    "--set", "train.max_steps=20",
    "--set", "train.log_every=5",
    "--set", "train.eval_batches=2",
    "--set", "checkpoint.every_steps=10",
    "--set", "ddp.backend=gloo",
    "--set", "ddp.device=cpu",
]  # fmt: skip
# Long enough to scrape /metrics or kill a pod while the job trains (~100 ms/step here).
LONGER = ["--set", "train.max_steps=80", "--set", "train.epochs=10"]
JOB_SECONDS = 150
DONE = re.compile(r"final loss ([0-9.]+) \(start ([0-9.]+)\)")


def render(kind: str, *args: str) -> JobPlan:
    argv = [*KUBEDDP, "render", kind, "--image", "kubeddp:cpu", "--validate-against", "offline"]
    done = subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )
    assert done.returncode == 0, f"kubeddp render failed:\n{done.stderr}"
    return plan_from_documents(load_documents(done.stdout))


def render_chart(values_file: Path, release: str) -> JobPlan:
    from helm_python import Chart

    values = yaml.safe_load(values_file.read_text())
    rendered = Chart.load(REPO / "charts" / "kubeddp").render(
        values, name=release, namespace="default", is_install=True
    )
    docs = [
        d
        for path, text in rendered.items()
        if "/tests/" not in path and path.endswith((".yaml", ".yml"))
        for d in load_documents(text)
    ]
    return plan_from_documents(docs)


def assert_trained(cluster: EmulatedCluster, world_size: int) -> None:
    """rank 0 reported the expected world size, and the loss fell."""
    logs = cluster.all_logs()
    sizes = {int(s) for s in re.findall(r"\| world size (\d+) \(gloo", logs)}
    assert sizes == {world_size}, f"world sizes {sizes}, expected {world_size}\n{logs[-3000:]}"
    done = DONE.findall(logs)
    assert done, f"no final loss line\n{cluster.log_tails()}"
    final, start = (float(x) for x in done[-1])
    assert final < start, f"loss did not fall: start {start}, final {final}"


def scrape(cluster: EmulatedCluster, pod: str) -> dict[str, float]:
    """The pod's /metrics as {name: value} (unlabelled samples), fetched inside the pod network."""
    run = cluster.pods[pod]
    url = f"http://{run.ip}:9400/metrics"
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
def test_pytorchjob_master_and_worker(cluster: EmulatedCluster) -> None:
    plan = render("pytorchjob", "--name", "pt", "--nodes", "2", "--nproc-per-node", "1",
                  *TINY, *LONGER)  # fmt: skip
    assert [p.name for p in plan.pods] == ["pt-master-0", "pt-worker-0"]
    cluster.start(plan)
    # While rank 0 trains, its /metrics (scraped from the pod network) shows the job.
    metrics = cluster.run_until(
        lambda: (m := scrape(cluster, "pt-master-0")).get("kubeddp_step", 0) > 0 and m,
        JOB_SECONDS,
        "kubeddp_step > 0 on pt-master-0:9400/metrics",
    )
    assert isinstance(metrics, dict)
    assert metrics.get("kubeddp_world_size") == 2, metrics
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert "rendezvous: pytorchjob, nodes 2, 1 workers/node" in cluster.logs("pt-worker-0")
    assert_trained(cluster, world_size=2)
    master_ckpts = cluster.volume("emptydir-pt-master-0-checkpoints")
    assert any(master_ckpts.iterdir()), "rank 0 wrote no checkpoint to its /checkpoints"


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_pytorchjob_master_and_two_workers_two_procs_each(cluster: EmulatedCluster) -> None:
    plan = render("pytorchjob", "--name", "pt3", "--nodes", "3", "--nproc-per-node", "2", *TINY)
    assert plan.pods[-1].operator_env["WORLD_SIZE"] == "6"
    assert plan.pods[-1].operator_env["RANK"] == "2"  # a node rank, not a process rank
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert_trained(cluster, world_size=6)


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_elastic_pod_killed_and_recreated_resumes(cluster: EmulatedCluster) -> None:
    plan = render(
        "pytorchjob", "--name", "el", "--elastic", "2:3", "--nodes", "3",
        "--nproc-per-node", "1", "--max-restarts", "3", "--checkpoint-size", "1Gi",
        *TINY, *LONGER,
    )  # fmt: skip
    assert plan.elastic and not any(p.replica_type == "Master" for p in plan.pods)
    cluster.start(plan)
    checkpoints = cluster.volume("pvc-")
    cluster.run_until(
        # a finished checkpoint: ckpt-<step>/COMPLETE is written last, then renamed into place
        lambda: any(checkpoints.glob("ckpt-*/COMPLETE")),
        JOB_SECONDS,
        "a complete checkpoint on the claim",
    )
    # A node dies under worker-2 (not worker-0, which hosts the c10d store); exit 137 is
    # retryable under restartPolicy ExitCode, so the operator recreates the pod.
    cluster.kill_pod("el-worker-2", signal.SIGKILL)
    cluster.run_until(lambda: cluster.status.restarts["el-worker-2"] == 1, 60, "pod recreated")
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert status.restarts["el-worker-2"] == 1, status
    logs = cluster.all_logs()
    resumed = re.findall(r"resumed from \S+ \(step (\d+)", logs)
    assert resumed and int(resumed[-1]) > 0, f"no resume from a checkpoint\n{cluster.log_tails()}"
    after_resume = logs[logs.rindex("resumed from") :]
    # The recreated pod is back in the group (min is 2: without it the world size would be 2).
    assert "| world size 3 (gloo" in after_resume, after_resume[:2000]
    recreated = [r for r in cluster.history if r.plan.name == "el-worker-2"][-1]
    assert "rendezvous: pytorchjob-elastic, nodes 2:3" in recreated.output(), recreated.tail()
    done = DONE.findall(logs)
    assert done and float(done[-1][0]) < float(done[-1][1]), f"loss did not fall: {done}"


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_trainjob_two_nodes(cluster: EmulatedCluster) -> None:
    plan = render("trainjob", "--name", "tj", "--nodes", "2", "--nproc-per-node", "1", *TINY)
    assert [p.name for p in plan.pods] == ["tj-node-0-0", "tj-node-0-1"]
    assert "tj-node-0-0.tj" in plan.pods[0].dns_names
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert "rendezvous: trainjob, nodes 2" in cluster.logs("tj-node-0-1")
    assert_trained(cluster, world_size=2)


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_indexed_job_two_pods(cluster: EmulatedCluster) -> None:
    plan = render("indexedjob", "--name", "ij", "--nodes", "2", "--nproc-per-node", "1", *TINY)
    assert [p.dns_names[-1] for p in plan.pods] == ["ij-0.ij", "ij-1.ij"]
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert "rendezvous: indexedjob, nodes 2" in cluster.logs("ij-1")
    assert_trained(cluster, world_size=2)


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_chart_with_kind_ci_values(cluster: EmulatedCluster) -> None:
    """What e2e-kind.yml installs with helm: 2 pods x KUBEDDP_CPU_NPROC=2 workers."""
    plan = render_chart(REPO / "charts" / "kubeddp" / "ci" / "cpu-kind-values.yaml", "ci")
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert_trained(cluster, world_size=4)


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_failing_master_fails_the_job(cluster: EmulatedCluster) -> None:
    """The emulation can fail: a launch error (exit 1-127) is permanent under ExitCode."""
    plan = render("pytorchjob", "--name", "bad", "--nodes", "2", "--nproc-per-node", "cpu",
                  "--env", "KUBEDDP_CPU_NPROC=two", *TINY)  # fmt: skip
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Failed", f"{status}\n{cluster.log_tails()}"
    assert "KUBEDDP_CPU_NPROC='two'" in cluster.logs("bad-master-0"), cluster.log_tails()
    assert cluster.status.restarts["bad-master-0"] == 0, "exit 2 is not retryable"
