"""The checkpoint keeper (a real `kubeddp keeper` process on 127.0.0.1) and the launcher's sync:
a pod's emptyDir is filled with the newest checkpoint and loose files, and what rank 0 writes
reaches the keeper's directory atomically; keep-N pruning and `.bad` renames follow."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from kubeddp.trainer.launcher import checkpoint_keeper as keeper
from kubeddp.trainer.launcher.checkpoint_sync import (
    CheckpointSync,
    KeeperClient,
    KeeperError,
    KeeperSettingError,
    wait_for_keeper,
    within,
)

pytestmark = pytest.mark.timeout(120)
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keeper(root: Path, port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "kubeddp", "keeper", "--dir", str(root), "--port", str(port),
            "--bind", "127.0.0.1"]  # fmt: skip
    return subprocess.Popen(argv, stderr=subprocess.PIPE, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.wait(10)


@contextlib.contextmanager
def _keeper_up(root: Path, port: int) -> Iterator[KeeperClient]:
    """A keeper serving `root` on `port` while the block runs (healthy before it starts)."""
    proc = _keeper(root, port)
    try:
        client = KeeperClient(f"http://127.0.0.1:{port}", timeout=10)
        wait_for_keeper(client, 60)
        yield client
    finally:
        _stop(proc)


def _within_as_the_keeper_returns(root: Path, port: int, call: Callable[[], T], log) -> T:
    """`within(60, log, call)` while the keeper is gone and comes back on `port` 2 s later."""
    started: list[subprocess.Popen[bytes]] = []
    back = threading.Timer(2.0, lambda: started.append(_keeper(root, port)))
    back.start()  # while `call` is failing
    try:
        return within(60, log, call)
    finally:
        back.cancel()
        back.join()
        for proc in started:
            _stop(proc)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[KeeperClient, Path]]:
    root = tmp_path / "claim"
    with _keeper_up(root, _free_port()) as client:
        yield client, root


def _checkpoint(root: Path, step: int, payload: bytes = b"state") -> Path:
    """A checkpoint as the trainer leaves it: written whole, COMPLETE inside, then in place."""
    final = root / f"ckpt-{step:08d}"
    temp = root / f".tmp-ckpt-{step:08d}"
    temp.mkdir(parents=True)
    (temp / "state.pt").write_bytes(payload * 1000)
    (temp / "config.yaml").write_text("train: {}\n")
    (temp / "COMPLETE").write_text("")
    os.replace(temp, final)
    return final


def _sync(client: KeeperClient, root: Path) -> CheckpointSync:
    return CheckpointSync(client, root, log=lambda line: None)


def test_a_new_pod_gets_the_newest_checkpoint_and_the_loose_files(
    served: tuple[KeeperClient, Path], tmp_path: Path
) -> None:
    client, claim = served
    first = _sync(client, tmp_path / "pod-a")
    assert first.fill() is None  # nothing saved yet
    for step in (5, 10):
        _checkpoint(first.root, step, payload=str(step).encode())
    (first.root / "snapshot.pt").write_bytes(b"epoch 3")
    (first.root / ".kubeddp-writer.lock").write_text("pid")
    sent = first.push()
    assert sent == ["ckpt-00000005", "ckpt-00000010", "snapshot.pt"]
    assert first.push() == []  # nothing changed
    assert (claim / "ckpt-00000010" / "COMPLETE").is_file()
    assert not (claim / ".kubeddp-writer.lock").exists()

    second = _sync(client, tmp_path / "pod-b")
    said = second.fill()
    assert said is not None
    assert said.startswith("checkpoint ckpt-00000010 (and 1 older) and 1 other file"), said
    assert sorted(p.name for p in second.root.iterdir()) == [
        "ckpt-00000005",
        "ckpt-00000010",
        "snapshot.pt",
    ]
    assert (second.root / "ckpt-00000010" / "state.pt").read_bytes() == b"10" * 1000
    assert (second.root / "snapshot.pt").read_bytes() == b"epoch 3"
    assert second.push() == []  # what it fetched is not sent back


def test_a_keeper_lost_after_its_health_check_is_fetched_from_again(tmp_path: Path) -> None:
    """The keeper answers /healthz, then is gone (a dropped connection, a restarted pod) and
    back on the same address: the fill tries again within the deadline instead of failing the
    pod's start."""
    root, port = tmp_path / "claim", _free_port()
    _checkpoint(root, 7, payload=b"seven")
    lines: list[str] = []
    with _keeper_up(root, port) as client:
        pass  # it answered its health check; now it is gone
    sync = CheckpointSync(client, tmp_path / "pod", log=lines.append)
    with pytest.raises(KeeperError):
        within(0, lines.append, sync.fill)  # no time left: the failure is the caller's
    said = _within_as_the_keeper_returns(root, port, sync.fill, lines.append)
    assert said is not None and said.startswith("checkpoint ckpt-00000007"), said
    assert (sync.root / "ckpt-00000007" / "state.pt").read_bytes() == b"seven" * 1000
    assert any("fetching again after" in line for line in lines), lines
    assert not list(sync.root.glob(".kubeddp-sync-*"))  # no staging left behind


def test_a_rejoining_pod_fetches_again_when_its_keeper_drops(tmp_path: Path) -> None:
    """Between two rendezvous rounds a pod fetches what the keeper got since; a keeper that
    drops the connection then (32 pods rejoining at once: "No route to host") is asked again
    within the deadline, and a failed fetch leaves no staging folder behind."""
    root, port = tmp_path / "claim", _free_port()
    _checkpoint(root, 4, payload=b"four")
    lines: list[str] = []
    with _keeper_up(root, port) as client:
        sync = CheckpointSync(client, tmp_path / "pod", log=lines.append)
        sync.fill()
    _checkpoint(root, 9, payload=b"nine")  # another pod's rank 0 saved it meanwhile
    with pytest.raises(KeeperError):
        within(0, lines.append, sync.refresh)
    assert not list(sync.root.glob(".kubeddp-sync-*"))
    fetched = _within_as_the_keeper_returns(root, port, sync.refresh, lines.append)
    assert fetched == ["ckpt-00000009"], fetched
    assert (sync.root / "ckpt-00000009" / "state.pt").read_bytes() == b"nine" * 1000
    assert any("fetching again after" in line for line in lines), lines


def test_pruning_and_bad_renames_reach_the_keeper(
    served: tuple[KeeperClient, Path], tmp_path: Path
) -> None:
    client, claim = served
    pod = _sync(client, tmp_path / "pod")
    pod.fill()
    for step in (5, 10, 15):
        _checkpoint(pod.root, step)
    pod.push()
    # keep=2 removed the oldest; a corrupt newest was set aside as .bad
    shutil.rmtree(pod.root / "ckpt-00000005")
    os.replace(pod.root / "ckpt-00000015", pod.root / "ckpt-00000015.bad")
    pod.push()
    assert sorted(p.name for p in claim.iterdir() if not p.name.startswith(".")) == [
        "ckpt-00000010",
        "ckpt-00000015.bad",
    ]
    # a later pod fetches the newest good one, not the .bad one
    later = _sync(client, tmp_path / "later")
    later.fill()
    assert sorted(p.name for p in later.root.iterdir()) == ["ckpt-00000010"]
    # its first new checkpoint replaces the older ones on the keeper
    _checkpoint(later.root, 20)
    later.push()
    names = sorted(p.name for p in claim.iterdir() if not p.name.startswith("."))
    assert names == ["ckpt-00000010", "ckpt-00000015.bad", "ckpt-00000020"]


def test_the_final_push_sends_the_last_files_and_removals_follow(
    served: tuple[KeeperClient, Path], tmp_path: Path
) -> None:
    client, claim = served
    pod = _sync(client, tmp_path / "pod")
    pod.fill()
    (pod.root / "runs").mkdir()
    (pod.root / "runs" / "snapshot.pt").write_bytes(b"one")
    assert pod.finish(5)
    assert (claim / "runs" / "snapshot.pt").read_bytes() == b"one"
    (pod.root / "runs" / "snapshot.pt").unlink()
    assert pod.push() == ["-runs/snapshot.pt"]
    assert not (claim / "runs" / "snapshot.pt").exists()


@pytest.mark.parametrize("path", ["../escape", "a/../../b", ".incoming/x", "%2e%2e/x", "a//b"])
def test_the_keeper_refuses_paths_outside_its_directory(
    served: tuple[KeeperClient, Path], tmp_path: Path, path: str
) -> None:
    client, claim = served
    source = tmp_path / "f"
    source.write_bytes(b"x")
    with pytest.raises(KeeperError, match="400"):
        client._upload(f"/v1/file/{path}", source)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "b").exists()


def test_relative_path_rules() -> None:
    assert keeper.relative_path("ckpt-1/state.pt") == "ckpt-1/state.pt"
    for bad in ("", "/abs", "a/..", ".hidden", "a/.x"):
        with pytest.raises(keeper.BadPath):
            keeper.relative_path(bad)


def test_an_absent_keeper_is_a_bounded_wait_and_a_bad_url_is_refused() -> None:
    client = KeeperClient(f"http://127.0.0.1:{_free_port()}", timeout=1)
    start = time.monotonic()
    with pytest.raises(KeeperError, match="did not answer within 1 s"):
        wait_for_keeper(client, 1)
    assert time.monotonic() - start < 30
    with pytest.raises(KeeperSettingError, match="is not http://HOST:PORT"):
        KeeperClient("s3://bucket")


def test_a_file_being_rewritten_is_not_sent_until_it_is_quiet(
    served: tuple[KeeperClient, Path], tmp_path: Path
) -> None:
    """torch.save rewrites a snapshot in place: a file that changes while it is looked at is
    left for the next interval, so the keeper never gets half of one version."""
    import threading

    client, claim = served
    pod = _sync(client, tmp_path / "pod")
    pod.fill()
    target = pod.root / "snapshot.pt"
    target.write_bytes(b"v0" * 1000)
    stop = threading.Event()

    def rewrite() -> None:
        version = 0
        while not stop.is_set():
            version += 1
            target.write_bytes(str(version).encode() * 1000)
            time.sleep(0.05)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        assert pod.push() == []  # changing all the time: never sent
    finally:
        stop.set()
        writer.join()
    assert not (claim / "snapshot.pt").exists()
    assert pod.push() == ["snapshot.pt"]
    assert (claim / "snapshot.pt").read_bytes() == target.read_bytes()


def _launch(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH") if k in os.environ}
    argv = [sys.executable, "-m", "kubeddp", "launch", "--nproc-per-node", "1", *args]
    return subprocess.run(
        argv, env={**base, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )


@pytest.mark.timeout(600)
def test_launch_without_its_keeper_exits_202_and_with_a_bad_url_exits_2(tmp_path: Path) -> None:
    """The keeper's pod not up within the wait is retried (>= 128); a bad setting is not."""
    env = {"KUBEDDP_CHECKPOINT_KEEPER": f"http://127.0.0.1:{_free_port()}",
           "KUBEDDP_RDZV_WAIT_SECONDS": "1"}  # fmt: skip
    done = _launch(tmp_path, env, "--", "--set", f"checkpoint.dir={tmp_path / 'ck'}")
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 202, done.stderr
    assert len(lines) == 1 and "did not answer within 1 s" in lines[0], done.stderr
    env["KUBEDDP_CHECKPOINT_KEEPER"] = "ftp://keeper"
    done = _launch(tmp_path, env, "--", "--set", f"checkpoint.dir={tmp_path / 'ck'}")
    assert done.returncode == 2, done.stderr
    assert "is not http://HOST:PORT" in done.stderr


@pytest.mark.timeout(600)  # two launches (torch imports) on a busy machine
def test_a_script_runs_in_the_filled_checkpoint_dir_and_its_snapshot_reaches_the_keeper(
    served: tuple[KeeperClient, Path], tmp_path: Path
) -> None:
    """A relative `snapshot.pt` saved by the program lands on the keeper; the next start of the
    pod (a new, empty dir) finds it there again."""
    client, claim = served
    script = tmp_path / "seed.py"
    script.write_text(
        "import os, pathlib\n"
        "p = pathlib.Path('snapshot.pt')\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "print('run', n, 'in', os.getcwd(), flush=True)\n"
    )
    for attempt in (1, 2):
        ck = tmp_path / f"pod-{attempt}"  # every pod incarnation: a fresh emptyDir
        (tmp_path / "config.yaml").write_text(f"checkpoint:\n  dir: {ck}\n")
        env = {"KUBEDDP_CHECKPOINT_KEEPER": client.url, "KUBEDDP_PROGRAM_IN_CHECKPOINT_DIR": "1"}
        done = _launch(tmp_path, env, "--config", str(tmp_path / "config.yaml"),
                       "--script", str(script))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"run {attempt} in {ck}" in done.stdout + done.stderr, done.stderr
        assert (claim / "snapshot.pt").read_text() == str(attempt)
