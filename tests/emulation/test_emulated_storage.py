"""Checkpoint storage on the clusters users have: a default StorageClass that is ReadWriteOnce
only (kind's local-path, EKS gp3...). The old shapes are reproduced first (a ReadWriteMany claim
stays Pending with every pod; a ReadWriteOnce claim mounted by pods on several nodes gives
Multi-Attach; ReadWriteOncePod admits one pod), then kubeddp's default, a keeper pod holding
the claim, schedules, loses the node-rank-0 pod and resumes: for the built-in trainer and for a
tutorial-style script that saves a relative `snapshot.pt` on rank 0 and loads it on every rank.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster import EmulatedCluster
from operator_env import JobPlan
from rendered_jobs import (
    BUDGET,
    JOB_SECONDS,
    LONGER,
    OOM_IMAGE_SCRIPT,
    OOM_SCRIPT,
    TINY,
    assert_resumed_from,
    assert_trained,
    exits,
    render,
    slow_steps,
)
from storage import KIND_STANDARD

pytestmark = [pytest.mark.netns, pytest.mark.slow]
SEED_SCRIPT = Path(__file__).with_name("seed_snapshot_train.py")
IMAGE_SCRIPT = "/app/seed_train.py"
SETTLE_SECONDS = 4.0  # long enough for the emulator to start whatever can start


def _rwo_only(factory: Callable[..., EmulatedCluster], **settings) -> EmulatedCluster:
    return factory(storage_classes=[KIND_STANDARD], **settings)


def _claim_modes(plan: JobPlan, modes: list[str]) -> JobPlan:
    """The claim as kubeddp rendered it before the keeper (the render now refuses these)."""
    (claim,) = plan.claims
    claim["spec"]["accessModes"] = modes
    return plan


def _settle(cluster: EmulatedCluster) -> None:
    end = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < end:
        cluster.tick()
        time.sleep(0.2)


def _mounted_plan(nodes: int) -> JobPlan:
    return render("pytorchjob", "--name", "old", "--nodes", str(nodes), "--nproc-per-node", "1",
                  "--checkpoint-storage", "mount", *TINY)  # fmt: skip


@pytest.mark.timeout(120)
def test_the_old_readwritemany_default_stays_pending_on_readwriteonce_storage(
    cluster_factory,
) -> None:
    cluster = _rwo_only(cluster_factory)
    plan = _mounted_plan(2)
    assert plan.claims[0]["spec"]["accessModes"] == ["ReadWriteMany"]  # mount, several pods
    cluster.start(plan)
    _settle(cluster)
    assert cluster.status.phase == "Running"
    assert all(run.pending and run.popen is None for run in cluster.pods.values())
    assert any("claim old-checkpoints Pending" in e and "ReadWriteMany not supported" in e
               for e in cluster.status.events), cluster.status.events  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "why"),
    [("ReadWriteOnce", "Multi-Attach error"), ("ReadWriteOncePod", "ReadWriteOncePod access")],
)
def test_a_one_node_claim_mounted_by_pods_on_two_nodes_holds_one_back(
    cluster_factory, mode: str, why: str
) -> None:
    cluster = _rwo_only(cluster_factory)
    cluster.start(_claim_modes(_mounted_plan(2), [mode]))
    _settle(cluster)
    running = [name for name, run in cluster.pods.items() if not run.pending]
    waiting = {name: run.pending for name, run in cluster.pods.items() if run.pending}
    assert running == ["old-worker-0"] and list(waiting) == ["old-worker-1"], waiting
    assert why in waiting["old-worker-1"], waiting


def _kill_node_rank_0_after(cluster: EmulatedCluster, pod: str, what: str, done) -> None:
    cluster.run_until(done, JOB_SECONDS, what)
    cluster.kill_pod(pod, signal.SIGKILL)  # the node is lost: no SIGTERM, no last sync
    cluster.run_until(lambda: cluster.status.restarts[pod] >= 1, 60, f"{pod} recreated")


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
@pytest.mark.parametrize("kind", ["pytorchjob", "indexedjob", "trainjob"])
def test_four_nodes_on_readwriteonce_storage_lose_node_rank_0_and_resume(
    cluster_factory, kind: str
) -> None:
    cluster = _rwo_only(cluster_factory, pod_security="restricted")
    # the loss comes while the job trains, not after its 80 steps (3 s bare; it raced once)
    plan = render(kind, "--name", "rw", "--nodes", "4", "--nproc-per-node", "1",
                  *TINY, *LONGER, *slow_steps(100))  # fmt: skip
    assert plan.claims[0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    (keeper,) = plan.deployments
    first = plan.pods[0].name
    cluster.start(plan)
    claim = lambda: cluster.volume("pvc-")  # noqa: E731 (the keeper's claim, once mounted)
    _kill_node_rank_0_after(
        cluster,
        first,
        "a checkpoint on the keeper's claim",
        lambda: cluster.pods[keeper.name].popen and any(claim().glob("ckpt-*/COMPLETE")),
    )
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    assert not cluster.rejected, cluster.rejected  # the keeper passes Pod Security restricted
    recreated = [r for r in cluster.history if r.plan.name == first][-1]
    fetched = re.search(r"checkpoint keeper \S+: fetched checkpoint ckpt-(\d+)", recreated.output())
    assert fetched, recreated.tail()
    # the first start after the loss (a TrainJob's pod restarts in place, and a peer's restart
    # can make it start once more)
    assert_resumed_from(recreated.output(), int(fetched.group(1)))
    assert_trained(cluster, world_size=4)
    steps = sorted(int(p.parent.name[5:]) for p in claim().glob("ckpt-*/COMPLETE"))
    assert steps and steps[-1] == 80, steps  # the last save reached the keeper


@pytest.mark.timeout(2 * JOB_SECONDS + 60)
def test_a_tutorial_script_resumes_from_its_relative_snapshot_on_readwriteonce_storage(
    cluster_factory,
) -> None:
    cluster = _rwo_only(cluster_factory, image_files={IMAGE_SCRIPT: SEED_SCRIPT})
    epochs = 12
    plan = render("pytorchjob", "--name", "sd", "--nodes", "4", "--nproc-per-node", "1",
                  "--script", IMAGE_SCRIPT, "--", str(epochs), "1", "--pause", "1")  # fmt: skip
    cluster.start(plan)
    snapshot = lambda: cluster.volume("pvc-") / "snapshot.pt"  # noqa: E731
    _kill_node_rank_0_after(
        cluster,
        "sd-worker-0",
        "snapshot.pt on the keeper's claim",
        lambda: "pvc-sd-checkpoints" in cluster.volumes and snapshot().is_file(),
    )
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    logs = cluster.all_logs()
    resumed = re.findall(r"\[rank (\d)\] Resuming training from snapshot at Epoch (\d+)", logs)
    # every rank of the new group loaded the same snapshot, saved before the kill
    assert sorted(rank for rank, _ in resumed) == ["0", "1", "2", "3"], cluster.log_tails()
    assert len({epoch for _, epoch in resumed}) == 1 and int(resumed[0][1]) >= 1, resumed
    assert f"finished {epochs} epochs" in logs
    assert "program runs in" in cluster.logs("sd-worker-0")


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_the_retry_budget_ends_an_oom_loop_under_the_keeper(cluster_factory) -> None:
    """Each recreated pod has a fresh emptyDir: launch's retry budget record must come back from
    the keeper with the checkpoints, or a worker OOM-killed at every start loops forever."""
    from kubeddp.trainer import exit_codes

    cluster = _rwo_only(cluster_factory, image_files={OOM_IMAGE_SCRIPT: OOM_SCRIPT})
    plan = render("pytorchjob", "--name", "om", "--nodes", "2", "--nproc-per-node", "2",
                  "--script", OOM_IMAGE_SCRIPT,
                  "--set", f"retries.without_progress={BUDGET}")  # fmt: skip
    assert plan.deployments, "two pods: the keeper holds the claim"
    cluster.start(plan)
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Failed", f"{status}\n{cluster.log_tails()}"
    by_pod: dict[str, list[int | None]] = {}
    for pod, code in exits(cluster):
        by_pod.setdefault(pod, []).append(code)
    exhausted = [pod for pod, codes in by_pod.items() if exit_codes.RETRIES_EXHAUSTED in codes]
    assert exhausted, by_pod
    for pod in exhausted:
        *retried, last = by_pod[pod]
        assert last == exit_codes.RETRIES_EXHAUSTED and len(retried) == BUDGET + 1, by_pod
        assert all(code is not None and code >= exit_codes.RETRYABLE_FROM for code in retried)
    records = sorted(p.name for p in (cluster.volume("pvc-") / ".kubeddp-retries").iterdir())
    assert f"{exhausted[0]}.json" in records, records
