"""DDP averages gradients: 2 processes x batch B end with the parameters of 1 process x batch 2B.

ResumableDistributedSampler gives rank r the samples perm[r::W] of one seeded permutation, so
at every step the two ranks together see exactly the 2B samples that one process with batch 2B
sees (perm[2Bk : 2B(k+1)]). The mean of the two ranks' mean-loss gradients is that process's
gradient; SGD with momentum is linear in the gradient, so a sum instead of a mean (or a rank
that trained alone) would end far away. Parameters are read from each run's final checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import procs

BATCH = 8
STEPS = 12
SETTINGS = [
    "workload.name=regression",
    "workload.samples=512",  # 461 training rows: 12 steps x 16 never reach the padded tail
    "train.optimizer=sgd",
    "train.lr=0.05",
    "train.warmup_steps=0",
    "train.grad_clip=0",
    f"train.max_steps={STEPS}",
    "train.seed=7",
    "metrics.port=0",
]


def final_parameters(tmp_path: Path, nproc: int, batch: int) -> dict[str, torch.Tensor]:
    ckpt_dir = tmp_path / f"ckpt-{nproc}x{batch}"
    argv = procs.kubeddp_argv("train", "--nproc", str(nproc))
    for s in (*SETTINGS, f"train.batch_size={batch}", f"checkpoint.dir={ckpt_dir}"):
        argv += ["--set", s]
    done = procs.run(argv, tmp_path / f"run-{nproc}x{batch}.log", timeout=240)
    assert done.code == 0, done.output[-4000:]
    assert f"world size {nproc} (gloo, cpu)" in done.output
    newest = sorted(ckpt_dir.glob("ckpt-*"))[-1]
    state = torch.load(newest / "state.pt", map_location="cpu", weights_only=True)
    assert state["step"] == STEPS
    return state["model"]


@pytest.mark.timeout(420)
@pytest.mark.slow
def test_two_processes_match_one_process_with_double_batch(tmp_path: Path) -> None:
    ddp = final_parameters(tmp_path, nproc=2, batch=BATCH)
    single = final_parameters(tmp_path, nproc=1, batch=2 * BATCH)
    assert ddp.keys() == single.keys()
    for name in ddp:
        torch.testing.assert_close(ddp[name], single[name], rtol=1e-4, atol=1e-5, msg=name)

    # The runs trained: the parameters moved well beyond the tolerance from their start.
    from kubeddp.trainer.config import WorkloadConfig
    from kubeddp.trainer.workloads import build_workload

    initial = build_workload(WorkloadConfig(name="regression", samples=512), 7).model.state_dict()
    moved = max((ddp[n] - initial[n]).abs().max().item() for n in ddp)
    assert moved > 1e-2, f"parameters moved only {moved}"
