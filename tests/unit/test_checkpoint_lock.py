"""trainer/worker/checkpoint/lock.py: one writer per checkpoint directory, released by the
kernel when its holder dies; a directory that is a file, a read-only one or a link at the
lock path is an error; safety.claim tells kubeddp's config copy from a user's config.yaml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubeddp.trainer.worker.checkpoint import CheckpointError, safety
from kubeddp.trainer.worker.checkpoint.local import LocalStorage
from kubeddp.trainer.worker.checkpoint.lock import LOCK_FILE, DirectoryInUse, WriterLock
from tests.helpers import mounts

pytestmark = pytest.mark.timeout(60)
HOLD = """
import os, sys, time
from kubeddp.trainer.worker.checkpoint.lock import WriterLock
assert WriterLock(sys.argv[1]).acquire() is None
if len(sys.argv) > 2 and os.fork() == 0:  # a forked helper, like a DataLoader worker
    time.sleep(60)
    os._exit(0)
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "ckpts")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryInUse, match=f"in use by another run \\(pid {holder.pid} on "):
            WriterLock(tmp_path / "ckpts").acquire()
        holder.kill()  # SIGKILL: no cleanup of its own
        holder.wait(10)
        lock = WriterLock(tmp_path / "ckpts")
        assert lock.acquire() is None and lock.held, "a dead holder's lock is free"
        assert f"pid {os.getpid()}" in (tmp_path / "ckpts" / LOCK_FILE).read_text()
        lock.release()
    finally:
        holder.kill()
        holder.wait(10)


def test_a_forked_child_does_not_keep_the_lock_of_a_dead_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "ckpts"), "fork"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(10)
        lock = WriterLock(tmp_path / "ckpts")
        assert lock.acquire() is None and lock.held, "the forked child must not hold it"
        lock.release()
    finally:
        os.killpg(holder.pid, 9)  # the forked child too
        holder.wait(10)


def test_a_directory_that_is_a_file_or_under_one(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match=f"checkpoint.dir {blocker} is a file"):
        WriterLock(blocker).acquire()
    with pytest.raises(CheckpointError, match="a part of its path is a file"):
        WriterLock(blocker / "sub").acquire()


def test_a_read_only_directory_is_refused_at_start(tmp_path: Path) -> None:
    # Issue 21: a directory that cannot be written is an error before training, not a warning.
    with mounts.tmpfs(tmp_path / "ro") as ro:
        (ro / "ckpts").mkdir()
        mounts.remount_readonly(ro)
        lock = WriterLock(ro / "ckpts")
        with pytest.raises(CheckpointError, match="is not writable \\(Read-only file system\\)"):
            lock.acquire()
    assert not lock.held


def test_a_link_at_the_lock_path_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "users-file"
    victim.write_text("precious")
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    (ckpts / LOCK_FILE).symlink_to(victim)
    with pytest.raises(CheckpointError, match="is a link or not a regular file"):
        WriterLock(ckpts).acquire()
    assert victim.read_text() == "precious"
    os.unlink(ckpts / LOCK_FILE)
    os.mkfifo(ckpts / LOCK_FILE)  # a FIFO must not block the open, and is refused too
    with pytest.raises(CheckpointError, match="not a regular file"):
        WriterLock(ckpts).acquire()


def test_a_config_copy_alone_is_kubeddps_when_it_says_so_and_a_users_is_not(
    tmp_path: Path,
) -> None:
    """A pod killed after its config copy reached the keeper but before its first checkpoint:
    the next pod gets config.yaml alone. kubeddp's copy says so on its first line and is
    claimed again (it was refused, exit 2, by every later pod with retries off); a user's own
    config.yaml alone is still refused, and a link or FIFO at that name is no note."""
    first = tmp_path / "first"
    safety.claim(LocalStorage(first), "train: {epochs: 1}\n", print)
    LocalStorage(first).release()
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    shutil.copy(first / "config.yaml", fetched / "config.yaml")  # what the keeper hands over
    again = LocalStorage(fetched)
    safety.claim(again, "train: {epochs: 2}\n", print)
    again.release()
    assert (fetched / "config.yaml").read_text().endswith("train: {epochs: 2}\n")
    for name, make in (
        ("users", lambda p: p.write_text("train: {lr: 0.1}\n")),
        ("link", lambda p: p.symlink_to(first / "config.yaml")),
        ("fifo", lambda p: os.mkfifo(p)),
    ):
        folder = tmp_path / name
        folder.mkdir()
        make(folder / "config.yaml")
        with pytest.raises(CheckpointError, match="did not write"):
            safety.claim(LocalStorage(folder), "train: {}\n", print)
