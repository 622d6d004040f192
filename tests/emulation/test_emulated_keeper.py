"""The checkpoint keeper on an emulated cluster when it does not serve: a job whose keeper never
comes up (its claim names a StorageClass the cluster lacks, so claim and keeper stay Pending)
ends Failed with KEEPER_UNREACHABLE on each kind, its pods saying every interval what to check,
instead of being recreated forever (a recreated PyTorchJob pod has a fresh emptyDir, and the
retry budget's record lives on the keeper).
"""

from __future__ import annotations

import pytest
from rendered_jobs import TINY, exits, render
from storage import KIND_STANDARD

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
