"""Issue 24's four data-loss cases, with real processes: nothing of the user's or of another
run is overwritten or pruned, and a new run's checkpoints survive kill -9 and are the ones
resumed. (The fourth case, a failed final save, is in test_checkpoint_errors.py.)"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.worker.checkpoint.lock import LOCK_FILE
from tests.helpers import checkpoints as ck
from tests.helpers import procs, workloads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _one_process(*settings: str) -> list[str]:
    argv = procs.kubeddp_argv(
        "train", "--nproc", "1",
        "--set", "workload.name=regression",
        "--set", "train.max_steps=3",
        "--set", "metrics.enabled=false",
    )  # fmt: skip
    for item in settings:
        argv += ["--set", item]
    return argv


def test_resume_never_keeps_the_other_run_and_its_own_checkpoints_survive_kill_9(
    tmp_path: Path,
) -> None:
    baseline = ck.baseline_state(tmp_path)
    ckpt_dir = tmp_path / "shared"
    shutil.copytree(ck.baseline_dir(tmp_path), ckpt_dir)  # another run's checkpoints
    old_steps = ck.steps(ckpt_dir)
    old = {step: _digests(ckpt_dir / f"ckpt-{step:08d}") for step in old_steps}
    # 10 ms per sample: the new run is killed long before its end.
    slow = procs.child_env({workloads.DELAY_ENV: "0.01"})
    own = ckpt_dir / f"ckpt-{2 * ck.SAVE_EVERY:08d}" / "COMPLETE"
    argv = ck.scenario_argv(ckpt_dir, "checkpoint.resume=never")
    with procs.started(argv, tmp_path / "never.log", slow) as run:
        procs.wait_until(own.exists, 120, "the new run's 2nd checkpoint", run)
        assert run.poll() is None, "the run ended before it could be killed"
        run.kill()  # SIGKILL the whole tree
    log = (tmp_path / "never.log").read_text()
    assert "checkpoint(s) of another run; kept them as" in log, log[-4000:]
    new_steps = ck.steps(ckpt_dir)
    assert new_steps and max(new_steps) < min(old_steps), f"only the new run is listed: {new_steps}"
    assert 2 * ck.SAVE_EVERY in new_steps, "the new run's checkpoint was pruned"
    kept = {p.name.split(".")[0]: p for p in ckpt_dir.glob("ckpt-*.previous-*")}
    assert sorted(kept) == [f"ckpt-{s:08d}" for s in old_steps]
    for step in old_steps:
        assert _digests(kept[f"ckpt-{step:08d}"]) == old[step], "the other run's data changed"
    # Started again (resume=auto, as a recreated pod would): the new run's newest is resumed.
    done = procs.run(ck.scenario_argv(ckpt_dir), tmp_path / "again.log", timeout=150)
    assert done.code == 0, done.output[-4000:]
    newest = max(new_steps)
    assert f"resumed from {ckpt_dir / f'ckpt-{newest:08d}'} (step {newest}," in done.output
    final = ck.newest_state(ckpt_dir)
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)
    for step in old_steps:
        assert _digests(kept[f"ckpt-{step:08d}"]) == old[step]


@pytest.mark.parametrize(
    ("setting", "files"),
    [
        ("checkpoint.dir=", ["config.yaml", "train.py"]),
        ("checkpoint.dir=.", ["config.yaml", "train.py"]),
        ("checkpoint.dir=.", ["config.yaml"]),  # the name kubeddp's config copy has
    ],
    ids=["empty", "dot", "dot-config-only"],
)
def test_the_working_directory_with_user_files_is_never_written(
    tmp_path: Path, setting: str, files: list[str]
) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    for name in files:
        (cwd / name).write_text(f"the user's own {name}\n")
    before = _digests(cwd)
    done = procs.run(_one_process(setting), tmp_path / "cwd.log", timeout=120, cwd=cwd)
    assert done.code == exit_codes.BAD_INPUT, done.output[-4000:]
    # an empty dir is refused by launch's config check, before any worker; `.` by the workers
    errors = [line for line in done.output.splitlines()
              if line.startswith(("kubeddp: error", "kubeddp train: error"))]  # fmt: skip
    assert errors and "checkpoint.dir" in errors[0], done.output[-4000:]
    assert "Traceback" not in done.output and "step 1/" not in done.output
    assert _digests(cwd) == before and sorted(p.name for p in cwd.iterdir()) == files


def test_a_directory_holding_user_files_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.txt").write_text("the user's data\n")
    done = procs.run(_one_process(f"checkpoint.dir={data}"), tmp_path / "data.log", 120)
    assert done.code == exit_codes.BAD_INPUT, done.output[-4000:]
    assert "that kubeddp did not write (e.g. 'corpus.txt')" in done.output
    assert [p.name for p in data.iterdir()] == ["corpus.txt"]


def test_a_link_at_the_lock_path_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("do not truncate\n")
    ckpt_dir = tmp_path / "ckpts"
    ckpt_dir.mkdir()
    (ckpt_dir / LOCK_FILE).symlink_to(victim)
    done = procs.run(_one_process(f"checkpoint.dir={ckpt_dir}"), tmp_path / "link.log", 120)
    assert done.code == exit_codes.BAD_INPUT, done.output[-4000:]
    assert f"{LOCK_FILE} is a link or not a regular file" in done.output
    assert victim.read_text() == "do not truncate\n"
    assert not ck.steps(ckpt_dir)
