"""The checkpoint keeper on an emulated cluster when it does not serve: a job whose keeper never
comes up (its claim names a StorageClass the cluster lacks, so claim and keeper stay Pending)
ends Failed with KEEPER_UNREACHABLE on each kind, its pods saying every interval what to check,
instead of being recreated forever (a recreated PyTorchJob pod has a fresh emptyDir, and the
retry budget's record lives on the keeper). A keeper on a zonal disk whose node is lost comes
back in the disk's zone after the eviction and the force-detach, and the job resumes.
"""

from __future__ import annotations

import re

import pytest
from rendered_jobs import (
    JOB_SECONDS,
    TINY,
    assert_resumed_from,
    assert_trained,
    exits,
    render,
    slow_steps,
)
from storage import EKS_GP3, KIND_STANDARD

from kubeddp.trainer import exit_codes

pytestmark = [pytest.mark.netns, pytest.mark.slow]
RDZV_WAIT = 2  # seconds: the pod's budget is this × (retries.without_progress + 1)
LIMIT = 1
SAY_SECONDS = 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["pytorchjob", "indexedjob", "trainjob"])
def test_a_job_whose_keeper_never_serves_ends_failed_with_one_line(
    cluster_factory, kind: str
) -> None:
    cluster = cluster_factory(storage_classes=[KIND_STANDARD])
    plan = render(kind, "--name", "nk", "--nodes", "2", "--nproc-per-node", "1", *TINY,
                  "--storage-class", "zonal-missing",
                  "--set", f"retries.without_progress={LIMIT}",
                  "--env", f"KUBEDDP_RDZV_WAIT_SECONDS={RDZV_WAIT}",
                  "--env", f"KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS={SAY_SECONDS}")  # fmt: skip
    (keeper,) = plan.deployments
    cluster.start(plan)
    status = cluster.wait_finished(60)
    assert status.phase == "Failed", f"{status}\n{cluster.log_tails()}"
    assert cluster.pods[keeper.name].pending, "the keeper never ran"
    ended = [(pod, code) for pod, code in exits(cluster) if pod != keeper.name]
    assert ended and all(code == exit_codes.KEEPER_UNREACHABLE for _, code in ended), ended
    budget = RDZV_WAIT * (LIMIT + 1)
    for pod in {pod for pod, _ in ended}:
        lines = cluster.logs(pod).splitlines()
        errors = [line for line in lines if "error:" in line]
        assert len(errors) == 1, errors  # one line says why the pod ended
        assert f"did not answer within {budget} s" in errors[0], errors
        assert "exit code 7 (keeper unreachable, fatal)" in errors[0], errors
        waiting = [line for line in lines if "has not answered for" in line]
        assert waiting and all("NetworkPolicy nk-keeper" in line for line in waiting), lines
    # nobody recreated a pod for it: each ended once
    assert sorted(pod for pod, _ in ended) == sorted({pod for pod, _ in ended}), ended


@pytest.mark.timeout(JOB_SECONDS + 60)
def test_a_keeper_on_a_zonal_disk_comes_back_in_its_zone_after_its_node_is_lost(
    cluster_factory,
) -> None:
    """The nodes of the keeper and of worker-0 are lost while the job trains: the keeper's pod
    is evicted (300 s) and replaced in the disk's zone, where it waits for the force-detach
    (6 min), both scaled down; the recreated worker-0 says every interval that the keeper does
    not answer and waits, then fetches the keeper's newest checkpoint and the job succeeds."""
    # 0.03: the keeper is back 20 s after the loss, well after worker-0's restart however loaded
    # the machine (0.01 let a slow restart find the new keeper already up)
    cluster = cluster_factory(storage_classes=[EKS_GP3], node_loss_scale=0.03)
    plan = render("pytorchjob", "--name", "kz", "--nodes", "2", "--nproc-per-node", "1",
                  *TINY, "--set", "train.max_steps=40", *slow_steps(200),
                  "--env", f"KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS={SAY_SECONDS}")  # fmt: skip
    (keeper,) = plan.deployments
    cluster.start(plan)
    claim = lambda: cluster.volume("pvc-")  # noqa: E731 (the keeper's claim, once mounted)
    saved = lambda: cluster.pods[keeper.name].popen and any(claim().glob("ckpt-*/COMPLETE"))  # noqa: E731
    cluster.run_until(saved, JOB_SECONDS, "a checkpoint on the keeper's claim")
    first = cluster.pods[keeper.name]
    cluster.lose_nodes(keeper.name, "kz-worker-0")
    status = cluster.wait_finished(JOB_SECONDS)
    assert status.phase == "Succeeded", f"{status}\n{cluster.log_tails()}"
    keepers = [run for run in cluster.history if run.plan.name == keeper.name]
    assert len(keepers) == 2 and keepers[1].zone == first.zone, [(k.node, k.zone) for k in keepers]
    (disk,) = cluster.storage.claims.values()
    assert disk.zone == first.zone  # the PV's node affinity
    events = status.events
    evicted = events.index(f"{keeper.name}: evicted from the lost node {first.node}")
    held = [e for e in events[evicted:] if "still attached to the lost node" in e]
    assert held, events  # the new keeper waited for the force-detach
    recreated = [r for r in cluster.history if r.plan.name == "kz-worker-0"][-1].output()
    waited = re.findall(r"checkpoint keeper \S+ has not answered for", recreated)
    assert waited, recreated[-3000:]  # said every interval while it waited
    fetched = re.search(r"checkpoint keeper \S+: fetched checkpoint ckpt-(\d+)", recreated)
    assert fetched, recreated[-3000:]
    assert_resumed_from(recreated, int(fetched.group(1)))
    assert_trained(cluster, world_size=2)
