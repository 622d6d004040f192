"""Reading what a training run left in its checkpoint directory, for test assertions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

from kubeddp.trainer.worker import checkpoint as ckpt


def newest(directory: Path) -> ckpt.CheckpointRef:
    refs = ckpt.list_checkpoints(directory)
    assert refs, (
        f"no complete checkpoint in {directory}: {sorted(p.name for p in directory.iterdir())}"
    )
    return refs[0]


def newest_state(directory: Path) -> dict[str, Any]:
    return ckpt.load_state(newest(directory))


def replace_state(checkpoint_dir: Path, content: object) -> None:
    """state.pt of a checkpoint replaced by `content`, its COMPLETE marker rewritten to match:
    a checkpoint that passes its digests but holds something else (another program's)."""
    from kubeddp.trainer.checkpoint_digest import digest_file, marker_text, read_marker

    torch.save(content, checkpoint_dir / ckpt.STATE_FILE)
    marker = checkpoint_dir / "COMPLETE"
    files = read_marker(marker.read_text()) or {}
    files[ckpt.STATE_FILE] = digest_file(checkpoint_dir / ckpt.STATE_FILE)
    step = int(checkpoint_dir.name.split("-")[1].split(".")[0])
    marker.write_text(marker_text(step, files))


def steps(directory: Path) -> list[int]:
    return sorted(ref.step for ref in ckpt.list_checkpoints(directory))


def sample_counts(state: dict[str, Any]) -> dict[int, Counter[int]]:
    """Epoch -> how often each sample id was trained, over all ranks of the run's history."""
    records = state.get("sample_record")
    assert records is not None, "checkpoint has no sample_record; run with train.record_sample_ids"
    counts: dict[int, Counter[int]] = {}
    for record in records:
        for epoch, ids in record.items():
            counts.setdefault(int(epoch), Counter()).update(ids)
    return counts


def assert_each_sample_once(state: dict[str, Any], dataset_len: int, epochs: int) -> None:
    counts = sample_counts(state)
    assert sorted(counts) == list(range(epochs)), f"epochs recorded: {sorted(counts)}"
    for epoch, counter in counts.items():
        twice = sorted(i for i, n in counter.items() if n > 1)
        never = sorted(set(range(dataset_len)) - set(counter))
        assert not twice and not never, (
            f"epoch {epoch}: {len(twice)} samples trained more than once (e.g. {twice[:5]}), "
            f"{len(never)} never (e.g. {never[:5]})"
        )


def assert_same_parameters(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Bitwise equality of model parameters (and optimizer moments) of two final states."""
    assert got["step"] == want["step"], (got["step"], want["step"])
    assert got["model"].keys() == want["model"].keys()
    for name, tensor in want["model"].items():
        diff = (got["model"][name] - tensor).abs().max().item()
        assert torch.equal(got["model"][name], tensor), f"{name} differs by up to {diff:.3e}"
    for pid, moments in want["optimizer"]["state"].items():
        for key, value in moments.items():
            other = got["optimizer"]["state"][pid][key]
            assert torch.equal(other, value), f"optimizer state {pid}.{key} differs"


# The resume scenario shared by the checkpoint, preemption and elastic tests: the regression
# workload (through tests.helpers.workloads, so a per-sample delay can slow it down) with
# 1152 training rows = 2 ranks x batch 16 x 36 steps, so no rank pads its last batch.
SAMPLES = 1280
TRAIN_ROWS = 1152
BATCH = 16
EPOCHS = 2
STEPS_2_RANKS = 72
SAVE_EVERY = 5


def scenario_settings(ckpt_dir: Path, *overrides: str) -> list[str]:
    """The workers' `--set` arguments of the scenario, `overrides` last."""
    from tests.helpers import workloads

    argv = workloads.settings(SAMPLES)
    for item in (
        f"train.batch_size={BATCH}",
        f"train.epochs={EPOCHS}",
        "train.record_sample_ids=true",
        "train.log_every=5",
        f"checkpoint.dir={ckpt_dir}",
        f"checkpoint.every_steps={SAVE_EVERY}",
        "checkpoint.keep=3",
        "metrics.enabled=false",
        *overrides,
    ):
        argv += ["--set", item]
    return argv


def scenario_argv(
    ckpt_dir: Path, *overrides: str, nproc: int = 2, max_restarts: int | None = None
) -> list[str]:
    """`kubeddp train` of the scenario on this machine."""
    from tests.helpers import procs

    argv = procs.kubeddp_argv("train", "--nproc", str(nproc))
    if max_restarts is not None:
        argv += ["--max-restarts", str(max_restarts)]
    return argv + scenario_settings(ckpt_dir, *overrides)


_baseline: dict[str, Any] = {}  # one uninterrupted run per test session


def baseline_state(work_dir: Path) -> dict[str, Any]:
    """Final state of one uninterrupted 2-process run of the scenario (run once per session)."""
    from tests.helpers import procs

    if "state" not in _baseline:
        ckpt_dir = work_dir / "baseline"
        done = procs.run(scenario_argv(ckpt_dir), work_dir / "baseline.log", timeout=150)
        assert done.code == 0, done.output[-4000:]
        _baseline["state"] = newest_state(ckpt_dir)
        _baseline["dir"] = ckpt_dir
    return _baseline["state"]


def baseline_dir(work_dir: Path) -> Path:
    """The uninterrupted run's checkpoint directory (treat as read-only: copy it to change it)."""
    baseline_state(work_dir)
    return _baseline["dir"]
