"""The checkpoint keeper (a real `kubeddp keeper` process on 127.0.0.1, with the job's secret)
and a pod's sync: a pod that reads checkpoints gets the newest one (an older one only when the
newest fails its digests) and a script's files; a pod that does not gets only its own records;
what rank 0 writes reaches the keeper whole; only the keeper prunes; set-aside checkpoints are
renamed there, never deleted; links, dot-files and stall reports are kept, and what cannot be
kept is said in one line without stopping the sync."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from kubeddp.trainer import constants, exit_codes
from kubeddp.trainer.checkpoint_digest import BlockHasher
from kubeddp.trainer.keeper.client import KeeperClient
from kubeddp.trainer.keeper.reach import (
    KeeperGaveUp,
    say_seconds,
    wait_budget,
    wait_for_keeper,
)
from kubeddp.trainer.keeper.sync import (
    CheckpointSync,
    KeeperError,
    KeeperSettingError,
    SyncSettings,
    start_from_env,
    within,
)
from tests.helpers import procs
from tests.helpers.keeper import (
    DrippingProxy,
    Keeper,
    checkpoint,
    keeper_argv,
    keeper_up,
    tamper,
    write_secret,
)
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(180)
T = TypeVar("T")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Keeper]:
    secret = write_secret(tmp_path / "secret")
    with keeper_up(tmp_path / "claim", tmp_path, secret) as keeper:
        yield keeper


def _sync(
    keeper: Keeper, root: Path, reads: bool = True, pod: str = "pod", lines=None
) -> CheckpointSync:
    log = lines.append if lines is not None else (lambda line: None)
    return CheckpointSync(keeper.client(), root, log, SyncSettings(reads=reads, keep=3, pod=pod))


def _within_as_the_keeper_returns(keeper: Keeper, call: Callable[[], T], log) -> T:
    """`within(60, log, call)` while the keeper is gone and comes back on its port 2 s later."""
    started: list[procs.Proc] = []
    argv = keeper_argv(keeper.root, keeper.port, keeper.secret_file)
    back = threading.Timer(
        2.0, lambda: started.append(procs.Proc(argv, keeper.root.parent / "k2.log"))
    )
    back.start()  # while `call` is failing
    try:
        return within(60, log, call)
    finally:
        back.cancel()
        back.join()
        for proc in started:
            proc.kill()


def test_a_reading_pod_gets_the_newest_checkpoint_only_and_the_loose_files(
    served: Keeper, tmp_path: Path
) -> None:
    first = _sync(served, tmp_path / "pod-a")
    assert first.fill() is None  # nothing saved yet
    for step in (5, 10):
        checkpoint(first.root, step, payload=str(step).encode())
    (first.root / "snapshot.pt").write_bytes(b"epoch 3")
    (first.root / ".kubeddp-writer.lock").write_text("pid")
    sent = first.push()
    assert sent == ["ckpt-00000005", "ckpt-00000010", "snapshot.pt"], sent
    assert first.push() == []  # nothing changed
    assert (served.root / "ckpt-00000010" / "COMPLETE").is_file()
    assert not (served.root / ".kubeddp-writer.lock").exists()

    second = _sync(served, tmp_path / "pod-b")
    said = second.fill()
    assert said is not None and said.startswith("checkpoint ckpt-00000010 and 1 other file"), said
    assert sorted(p.name for p in second.root.iterdir()) == ["ckpt-00000010", "snapshot.pt"]
    state = (second.root / "ckpt-00000010" / "state.pt").read_bytes()
    assert state == (served.root / "ckpt-00000010" / "state.pt").read_bytes()
    assert (second.root / "snapshot.pt").read_bytes() == b"epoch 3"
    assert second.push() == []  # what it fetched is not sent back


def test_a_pod_that_reads_no_checkpoint_fetches_only_its_own_records(
    served: Keeper, tmp_path: Path
) -> None:
    """The built-in trainer reads on rank 0: the other pods fetch their retry record and the
    finished-run record, and see the keeper's progress for their retry budget."""
    writer = _sync(served, tmp_path / "rank0")
    checkpoint(writer.root, 7)
    (writer.root / "snapshot.pt").write_bytes(b"x")
    for pod in ("rank0", "peer", "_finished"):
        (writer.root / ".kubeddp-retries").mkdir(exist_ok=True)
        (writer.root / ".kubeddp-retries" / f"{pod}.json").write_text("{}")
    writer.push(final=True)
    peer = _sync(served, tmp_path / "peer", reads=False, pod="peer")
    assert peer.fill() == "no checkpoint and 2 other file(s), 0.0 MB"
    assert sorted(str(p.relative_to(peer.root)) for p in peer.root.rglob("*") if p.is_file()) == [
        ".kubeddp-retries/_finished.json",
        ".kubeddp-retries/peer.json",
    ]
    newest = (served.root / "ckpt-00000007" / "state.pt").stat().st_mtime_ns
    assert peer.progress_ns() >= newest  # the checkpoint advanced, though not fetched here


def test_a_newest_checkpoint_that_fails_its_digests_falls_back_and_is_never_saved(
    served: Keeper, tmp_path: Path
) -> None:
    writer = _sync(served, tmp_path / "writer")
    for step in (3, 6):
        checkpoint(writer.root, step, payload=bytes([step]), size=3 << 20)
    writer.push()
    tamper(served.root / "ckpt-00000006" / "state.pt")  # bit rot on the keeper's disk
    lines: list[str] = []
    reader = _sync(served, tmp_path / "reader", lines=lines)
    said = reader.fill()
    assert said is not None and said.startswith("checkpoint ckpt-00000003"), said
    assert not (reader.root / "ckpt-00000006").exists()
    assert not list(reader.root.glob(".kubeddp-sync-*"))  # nothing half fetched left
    assert any("ckpt-00000006 failed its check" in line for line in lines), lines


def test_a_checkpoint_an_older_kubeddp_wrote_is_kept_and_checked_with_its_sha256(
    served: Keeper, tmp_path: Path
) -> None:
    """Before BLAKE3 a marker (format v1) recorded SHA-256 without naming it: such a checkpoint
    is sent, checked and fetched with SHA-256, and a changed byte still fails the check."""
    writer = _sync(served, tmp_path / "writer")
    for step in (2, 4):
        unit = checkpoint(writer.root, step, payload=bytes([step]), size=(2 << 20) + 5)
        record = json.loads((unit / "COMPLETE").read_text())
        record["format"] = "kubeddp-checkpoint-v1"
        for name, entry in record["files"].items():
            hasher = BlockHasher(entry["block"], "sha256")
            hasher.update((unit / name).read_bytes())
            record["files"][name] = {k: v for k, v in hasher.finish().to_json().items()
                                     if k != "algorithm"}  # fmt: skip
        (unit / "COMPLETE").write_text(json.dumps(record))
    assert writer.push() == ["ckpt-00000002", "ckpt-00000004"]
    kept = json.loads((served.root / "ckpt-00000004" / ".kubeddp-keeper.json").read_text())
    assert kept["files"]["state.pt"]["algorithm"] == "sha256"  # the writer's, checked as such
    assert kept["files"]["COMPLETE"]["algorithm"] == "blake3"  # the marker: hashed by the pod
    reader = _sync(served, tmp_path / "reader")
    assert (reader.fill() or "").startswith("checkpoint ckpt-00000004")
    fetched = (reader.root / "ckpt-00000004" / "state.pt").read_bytes()
    assert fetched == (writer.root / "ckpt-00000004" / "state.pt").read_bytes()
    tamper(served.root / "ckpt-00000004" / "state.pt")
    again = _sync(served, tmp_path / "again")
    assert (again.fill() or "").startswith("checkpoint ckpt-00000002")


def test_a_recommit_during_a_fetch_never_mixes_two_versions(served: Keeper, tmp_path: Path) -> None:
    """A fetch with a listing taken before the step was saved again is refused (409) and the
    files of the new version are never taken for the old one's."""
    writer = _sync(served, tmp_path / "writer")
    checkpoint(writer.root, 4, payload=b"old", size=2 << 20)
    writer.push()
    reader = _sync(served, tmp_path / "reader")
    listing = reader.client.listing()
    shutil.rmtree(writer.root / "ckpt-00000004")
    writer.units.clear()
    checkpoint(writer.root, 4, payload=b"new", size=2 << 20)
    writer.push()
    assert reader._fetch_newest(listing) is None  # the old version is gone: nothing mixed
    assert not (reader.root / "ckpt-00000004").exists()
    assert reader.fill() is not None  # a new listing: the new version, whole
    assert (reader.root / "ckpt-00000004" / "state.pt").read_bytes()[:3] == b"new"


def test_a_keeper_lost_after_its_health_check_is_fetched_from_again(tmp_path: Path) -> None:
    """The keeper answers /healthz, then is gone (a dropped connection, a restarted pod) and
    back on the same address: the fill tries again within the deadline instead of failing the
    pod's start."""
    secret = write_secret(tmp_path / "secret")
    root = tmp_path / "claim"
    lines: list[str] = []
    with keeper_up(root, tmp_path, secret) as keeper:
        seeded = _sync(keeper, tmp_path / "seed")
        checkpoint(seeded.root, 7, payload=b"seven")
        seeded.push()
    sync = _sync(keeper, tmp_path / "pod", lines=lines)
    with pytest.raises(KeeperError):
        within(0, lines.append, sync.fill)  # no time left: the failure is the caller's
    said = _within_as_the_keeper_returns(keeper, sync.fill, lines.append)
    assert said is not None and said.startswith("checkpoint ckpt-00000007"), said
    assert (sync.root / "ckpt-00000007" / "state.pt").read_bytes()[:5] == b"seven"
    assert any("fetching again after" in line for line in lines), lines
    assert not list(sync.root.glob(".kubeddp-sync-*"))  # no staging left behind


@pytest.mark.parametrize("drips", ["/v2/list", "/v2/file/"])
def test_a_keeper_whose_answers_never_finish_ends_the_start_within_its_budget(
    drips: str, tmp_path: Path
) -> None:
    """Its listing (or a block) comes a byte every 0.2 s: every read is within the 60 s
    timeout, and a starting pod once waited on it for ever. Every exchange now has a deadline
    of its own and ends within the pod's budget: a retryable failure, said in one line."""
    secret = write_secret(tmp_path / "secret")
    with keeper_up(tmp_path / "claim", tmp_path, secret) as keeper:
        seeded = _sync(keeper, tmp_path / "seed")
        checkpoint(seeded.root, 7, payload=b"seven", size=1 << 20)
        seeded.push()
        proxy = DrippingProxy(keeper.port, (drips,))
        env = {constants.ENV_CHECKPOINT_KEEPER: proxy.url,
               constants.ENV_CHECKPOINT_KEEPER_TOKEN_FILE: str(secret)}  # fmt: skip
        lines: list[str] = []
        try:
            with pytest.raises(KeeperError) as failed:
                start_from_env(env, str(tmp_path / "pod"), 3.0, lines.append,
                               SyncSettings(reads=True))  # fmt: skip
        finally:
            proxy.close()
    assert "did not end within" in str(failed.value) or "wait for it is over" in str(failed.value)
    assert not (tmp_path / "pod" / "ckpt-00000007").exists()


def test_a_rejoining_pod_fetches_again_when_its_keeper_drops(tmp_path: Path) -> None:
    """Between two rendezvous rounds a pod fetches what the keeper got since; a keeper that
    drops the connection then is asked again within the deadline, and a failed fetch leaves no
    staging folder behind."""
    secret = write_secret(tmp_path / "secret")
    lines: list[str] = []
    with keeper_up(tmp_path / "claim", tmp_path, secret) as keeper:
        writer = _sync(keeper, tmp_path / "writer")
        checkpoint(writer.root, 4, payload=b"four")
        writer.push()
        sync = _sync(keeper, tmp_path / "pod", lines=lines)
        sync.fill()
        checkpoint(writer.root, 9, payload=b"nine")  # another pod's rank 0 saved it meanwhile
        writer.push()
    with pytest.raises(KeeperError):
        within(0, lines.append, sync.refresh)
    assert not list(sync.root.glob(".kubeddp-sync-*"))
    fetched = _within_as_the_keeper_returns(keeper, sync.refresh, lines.append)
    assert fetched == ["ckpt-00000009"], fetched
    assert (sync.root / "ckpt-00000009" / "state.pt").read_bytes()[:4] == b"nine"


def test_only_the_keeper_prunes_and_set_aside_checkpoints_are_renamed_there(
    served: Keeper, tmp_path: Path
) -> None:
    pod = _sync(served, tmp_path / "pod")
    for step in (5, 10, 15):
        checkpoint(pod.root, step)
    pod.push()
    # this pod pruned its oldest; a corrupt newest was set aside as .bad
    shutil.rmtree(pod.root / "ckpt-00000005")
    os.replace(pod.root / "ckpt-00000015", pod.root / "ckpt-00000015.bad")
    assert pod.push() == ["ckpt-00000015 -> ckpt-00000015.bad"]
    assert served.names() == ["ckpt-00000005", "ckpt-00000010", "ckpt-00000015.bad"]
    later = _sync(served, tmp_path / "later")  # gets the newest good one, not the .bad one
    later.fill()
    assert sorted(p.name for p in later.root.iterdir()) == ["ckpt-00000010"]
    for step in (20, 25, 30):  # keep=3: the keeper removes the oldest beyond it
        checkpoint(later.root, step)
    later.push()
    expected = ["ckpt-00000020", "ckpt-00000025", "ckpt-00000030", "ckpt-00000015.bad"]
    assert sorted(served.names()) == sorted(expected)


def test_a_run_that_keeps_apart_another_runs_checkpoints_sets_them_all_aside(
    served: Keeper, tmp_path: Path
) -> None:
    """resume=never moves the checkpoints it found aside as .previous-TIME before its first
    save: on the keeper the older ones it never fetched go aside too, so the keeper's pruning
    and the next start see only the new run's."""
    old = _sync(served, tmp_path / "old-run")
    for step in (40, 50):
        checkpoint(old.root, step)
    old.push()
    new = _sync(served, tmp_path / "new-run")
    new.fill()  # the newest, ckpt-00000050
    os.replace(new.root / "ckpt-00000050", new.root / "ckpt-00000050.previous-20260101T000000Z")
    checkpoint(new.root, 5)
    new.push()
    assert sorted(served.names()) == [
        "ckpt-00000005",
        "ckpt-00000040.previous-20260101T000000Z",
        "ckpt-00000050.previous-20260101T000000Z",
    ]


def test_links_dot_files_and_stall_reports_are_kept_and_the_rest_is_said_once(
    served: Keeper, tmp_path: Path
) -> None:
    lines: list[str] = []
    pod = _sync(served, tmp_path / "pod", lines=lines)
    checkpoint(pod.root, 2)
    (pod.root / "latest").symlink_to("ckpt-00000002")
    (pod.root / "escape").symlink_to("/etc/passwd")
    (pod.root / ".env").write_text("dot")
    (pod.root / ".kubeddp-diagnostics").mkdir()
    (pod.root / ".kubeddp-diagnostics" / "stall-rank0.txt").write_text("stuck in all_reduce")
    os.mkfifo(pod.root / "pipe")
    bad_name = os.fsdecode(b"caf\xe9.pt")  # Latin-1, not UTF-8
    (pod.root / bad_name).write_bytes(b"x")
    pod.start(0.05)  # the thread: it must live through all of this
    assert pod.finish(30) is True  # what cannot be kept is said, not a failure
    assert os.readlink(served.root / "latest") == "ckpt-00000002"
    assert (served.root / ".env").read_text() == "dot"
    assert (served.root / ".kubeddp-diagnostics" / "stall-rank0.txt").is_file()
    assert not (served.root / "escape").exists() and not (served.root / "pipe").exists()
    refused = [line for line in lines if "not kept" in line]
    assert len(refused) == 3, lines
    assert any("caf\\xe9.pt" in line and "not UTF-8" in line for line in refused), refused
    reader = _sync(served, tmp_path / "reader")
    reader.fill()
    assert os.readlink(reader.root / "latest") == "ckpt-00000002"
    assert (reader.root / ".env").read_text() == "dot"


def test_the_final_push_sends_the_last_files_and_removals_follow(
    served: Keeper, tmp_path: Path
) -> None:
    pod = _sync(served, tmp_path / "pod")
    pod.fill()
    (pod.root / "runs").mkdir()
    (pod.root / "runs" / "snapshot.pt").write_bytes(b"one")
    assert pod.finish(5)
    assert (served.root / "runs" / "snapshot.pt").read_bytes() == b"one"
    (pod.root / "runs" / "snapshot.pt").unlink()
    assert pod.push() == ["-runs/snapshot.pt"]
    assert not (served.root / "runs" / "snapshot.pt").exists()


def test_the_finished_record_waits_for_the_last_checkpoint(served: Keeper, tmp_path: Path) -> None:
    """A run's "finished" record must not reach the keeper before its last checkpoint: a late
    pod would end at once though the run's result is not kept."""
    pod = _sync(served, tmp_path / "pod")
    final = checkpoint(pod.root, 9, size=1 << 20)
    (pod.root / ".kubeddp-retries").mkdir()
    (pod.root / ".kubeddp-retries" / "_finished.json").write_text("{}")
    (final / "state.pt").write_bytes(b"changed after the marker")  # its digests no longer hold
    assert pod.finish(3) is False
    assert not (served.root / "ckpt-00000009").exists()
    assert not (served.root / ".kubeddp-retries" / "_finished.json").exists()


def test_a_file_being_rewritten_is_not_sent_until_it_is_quiet(
    served: Keeper, tmp_path: Path
) -> None:
    """torch.save rewrites a snapshot in place: a file that changes while it is looked at is
    left for the next interval, so the keeper never gets half of one version."""
    pod = _sync(served, tmp_path / "pod")
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
    assert not (served.root / "snapshot.pt").exists()
    assert pod.push() == ["snapshot.pt"]
    assert (served.root / "snapshot.pt").read_bytes() == target.read_bytes()


def test_a_rejoining_pod_keeps_its_own_unsent_write_and_the_final_push_sends_it(
    served: Keeper, tmp_path: Path
) -> None:
    """A file rewritten while a push looked at it (a worker's last TensorBoard events as the
    group restarted) was left for the next push; the rejoin's fetch then laid the keeper's older
    copy over it, the next pushes saw nothing changed, and the finished pod waited out its
    whole grace period and exited 204 (the 8-node TrainJob in CI)."""
    pod = _sync(served, tmp_path / "pod")
    pod.fill()
    events = pod.root / "tensorboard" / "events.out"
    events.parent.mkdir()
    events.write_bytes(b"first" * 100)
    assert pod.push() == ["tensorboard/events.out"]
    stop = threading.Event()

    def rewrite() -> None:
        version = 0
        while not stop.is_set():
            version += 1
            events.write_bytes(b"later" * (100 + version))
            time.sleep(0.05)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        assert pod.push() == []  # changing all the time: owed to the next push
    finally:
        stop.set()
        writer.join()
    newest = events.read_bytes()
    pod.refresh()
    assert events.read_bytes() == newest  # not the keeper's older copy
    assert pod.finish(5)
    assert (served.root / "tensorboard" / "events.out").read_bytes() == newest


def test_an_absent_keeper_is_a_bounded_wait_said_every_interval(tmp_path: Path) -> None:
    client = KeeperClient(f"http://127.0.0.1:{free_port()}", timeout=1)
    lines: list[str] = []
    with pytest.raises(KeeperError, match="did not answer within 1.5 s"):
        wait_for_keeper(client, 1.5, lines.append, say_every=0.5)
    assert lines and all("has not answered for" in line for line in lines), lines
    assert "kubectl get pods -l kubeddp.io/checkpoint-keeper=127" in lines[0], lines
    with pytest.raises(KeeperSettingError, match=r"is not http://HOST\[:PORT\]"):
        KeeperClient("s3://bucket")


def test_the_wait_for_an_absent_keeper_is_the_pods_whole_budget_in_one_process(
    served: Keeper,
) -> None:
    """A real closed port: with a retry limit the pod waits one rendezvous wait per start the
    budget allows, saying so, then gives up (fatal); a keeper that answers ends the wait."""
    port = free_port()
    client = KeeperClient(f"http://127.0.0.1:{port}", timeout=1)
    lines: list[str] = []
    with pytest.raises(KeeperGaveUp) as gave_up:
        wait_for_keeper(client, 0.5, lines.append, limit=2, say_every=0.4)
    assert wait_budget(0.5, 2) == 1.5 and wait_budget(0.5, 0) == 0.5
    said = str(gave_up.value)
    assert "did not answer within 1.5 s" in said and "retries.without_progress 2 + 1" in said
    for what in ("kubeddp.io/checkpoint-keeper=127", "kubectl get pvc", "NetworkPolicy 127",
                 "Secret 127-token"):  # fmt: skip
        assert what in said, said
    # said while it waits, each time with the whole budget, not one rendezvous wait
    assert lines and all("of 1.5 s" in line for line in lines), lines
    assert exit_codes.BY_CODE[exit_codes.KEEPER_UNREACHABLE].retryable is False
    said_before = len(lines)
    wait_for_keeper(served.client(), 0.5, lines.append, limit=2, say_every=0.1)
    assert len(lines) == said_before  # answered at once: nothing said, nothing raised
    with pytest.raises(KeeperSettingError, match="KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS='x'"):
        say_seconds({"KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS": "x"})
    assert say_seconds({}) == 30.0


def _launch(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH") if k in os.environ}
    argv = [sys.executable, "-m", "kubeddp", "launch", "--nproc-per-node", "1", *args]
    return subprocess.run(
        argv, env={**base, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )


@pytest.mark.timeout(600)
def test_launch_without_its_keeper_ends_fatal_after_its_budget_and_with_a_bad_setting_exits_2(
    tmp_path: Path,
) -> None:
    """The keeper not up within the pod's budget (rendezvous wait × (retries.without_progress
    + 1), kept in this process: a recreated pod's count would start again) ends the pod with
    7, fatal on every kind; with no retry limit one wait is retried (202). A bad address or a
    missing secret file is not retried."""
    ck = tmp_path / "ck"
    env = {"KUBEDDP_CHECKPOINT_KEEPER": f"http://127.0.0.1:{free_port()}",
           "KUBEDDP_RDZV_WAIT_SECONDS": "1", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
           "KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS": "0.5"}  # fmt: skip
    for limit, expected, within_s in ((2, 7, "3"), (0, 202, "1")):
        args = ("--", "--set", f"checkpoint.dir={ck}", "--set", f"retries.without_progress={limit}")
        done = _launch(tmp_path, env, *args)
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        assert done.returncode == expected, done.stderr
        assert len(errors) == 1 and f"did not answer within {within_s} s" in errors[0], done.stderr
        assert f"exit code {expected} (" in errors[0], errors
        waiting = [line for line in done.stderr.splitlines() if "has not answered for" in line]
        assert waiting and all(f"of {within_s} s" in line for line in waiting), done.stderr
    env["KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS"] = "0"
    done = _launch(tmp_path, env, *args)
    assert done.returncode == 2 and "KEEPER_SAY_SECONDS='0'" in done.stderr, done.stderr
    del env["KUBEDDP_CHECKPOINT_KEEPER_SAY_SECONDS"]
    env["KUBEDDP_CHECKPOINT_KEEPER"] = "ftp://keeper"
    done = _launch(tmp_path, env, *args)
    assert done.returncode == 2 and "is not http://HOST[:PORT]" in done.stderr, done.stderr
    env |= {"KUBEDDP_CHECKPOINT_KEEPER": "http://127.0.0.1:1",
            "KUBEDDP_CHECKPOINT_KEEPER_TOKEN_FILE": str(tmp_path / "missing")}  # fmt: skip
    done = _launch(tmp_path, env, *args)
    assert done.returncode == 2 and "secret file" in done.stderr, done.stderr
    assert str(tmp_path / "missing") in done.stderr


@pytest.mark.timeout(600)  # two launches (torch imports) on a busy machine
def test_a_script_runs_in_the_filled_checkpoint_dir_and_its_snapshot_reaches_the_keeper(
    served: Keeper, tmp_path: Path
) -> None:
    """A relative `snapshot.pt` saved by the program lands on the keeper; the next start of the
    pod (a new, empty dir) finds it there again."""
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
        env = {"KUBEDDP_CHECKPOINT_KEEPER": served.url, "KUBEDDP_PROGRAM_IN_CHECKPOINT_DIR": "1",
               "KUBEDDP_CHECKPOINT_KEEPER_TOKEN_FILE": str(served.secret_file)}  # fmt: skip
        done = _launch(tmp_path, env, "--config", str(tmp_path / "config.yaml"),
                       "--script", str(script))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"run {attempt} in {ck}" in done.stdout + done.stderr, done.stderr
        assert (served.root / "snapshot.pt").read_text() == str(attempt)


@pytest.mark.timeout(600)
def test_a_finished_run_whose_last_files_cannot_reach_the_keeper_exits_204(
    tmp_path: Path,
) -> None:
    """The keeper is gone by the time the program ends: the pod does not exit 0 (its emptyDir
    would go with the last snapshot); it ends with CHECKPOINT_NOT_KEPT, retried."""
    secret = write_secret(tmp_path / "secret")
    script = tmp_path / "save.py"
    script.write_text(
        "import os, pathlib, time\n"
        "while not pathlib.Path(os.environ['GO']).exists(): time.sleep(0.1)\n"
        "pathlib.Path('snapshot.pt').write_text('result')\n"
    )
    ck, go = tmp_path / "pod", tmp_path / "go"
    with keeper_up(tmp_path / "claim", tmp_path, secret) as keeper:
        env = {"KUBEDDP_CHECKPOINT_KEEPER": keeper.url, "KUBEDDP_PROGRAM_IN_CHECKPOINT_DIR": "1",
               "KUBEDDP_CHECKPOINT_KEEPER_TOKEN_FILE": str(secret), "GO": str(go),
               "KUBEDDP_TERMINATION_GRACE_SECONDS": "3",
               "KUBEDDP_CHECKPOINT_KEEPER_SEND_SLACK_SECONDS": "2"}  # fmt: skip
        (tmp_path / "config.yaml").write_text(f"checkpoint:\n  dir: {ck}\n")
        config = str(tmp_path / "config.yaml")
        argv = procs.kubeddp_argv("launch", "--nproc-per-node", "1", "--config", config,
                                  "--script", str(script))  # fmt: skip
        proc = procs.Proc(argv, tmp_path / "launch.log", procs.child_env(env), cwd=tmp_path)
        try:
            proc.wait_for_output(r"checkpoint keeper .*: nothing fetched", 300)
            keeper.proc.kill()  # gone before the program's result
            go.touch()
            code = proc.wait(300)
        finally:
            proc.kill()
    assert code == 204, proc.tail()
    assert "did not reach the checkpoint keeper" in proc.output(), proc.tail()
    assert (ck / "snapshot.pt").read_text() == "result"


def test_a_pod_killed_after_its_config_copy_left_before_its_first_checkpoint(
    served: Keeper, tmp_path: Path
) -> None:
    """Retries off, so no retry record: the keeper held config.yaml alone, and every later pod
    refused checkpoint.dir as a user's working directory (exit 2). The copy says it is
    kubeddp's on its first line: the next pod claims the directory and trains."""
    from kubeddp.trainer.worker.checkpoint import safety
    from kubeddp.trainer.worker.checkpoint.local import LocalStorage

    first = _sync(served, tmp_path / "first")
    storage = LocalStorage(first.root)
    safety.claim(storage, "train: {epochs: 1}\n", lambda _m: None)
    first.push(final=True)
    storage.release()  # the pod is gone: its emptyDir with it
    assert [p.name for p in served.root.iterdir() if not p.name.startswith(".")] == ["config.yaml"]
    second = _sync(served, tmp_path / "second")
    second.fill()
    assert sorted(p.name for p in second.root.iterdir()) == ["config.yaml"]
    again = LocalStorage(second.root)
    safety.claim(again, "train: {epochs: 1}\n", lambda _m: None)  # no longer refused
    again.release()


def test_links_in_a_listing_are_never_recreated_or_written_through_outside_the_dir(
    tmp_path: Path,
) -> None:
    """Someone who can write the keeper's volume plants links that leave checkpoint.dir: a pod
    recreated them, and a later fetch wrote through them. A listed link is recreated only when
    its target stays inside (judged by its text), and a fetched file is placed a folder at a
    time without following a link, whatever is in the pod's checkpoint.dir."""
    secret = write_secret(tmp_path / "secret")
    outside = tmp_path / "outside"
    outside.mkdir()
    claim = tmp_path / "claim"
    claim.mkdir()
    (claim / "up").symlink_to("../../outside")
    (claim / "abs").symlink_to(str(outside))
    (claim / "latest").symlink_to("notes/today")
    (claim / "notes").mkdir()
    (claim / "notes" / "today").write_text("kept\n")
    (claim / "sub").mkdir()
    (claim / "sub" / "x").write_text("through the link\n")
    lines: list[str] = []
    with keeper_up(claim, tmp_path, secret) as keeper:
        pod = tmp_path / "pod"
        pod.mkdir()
        (pod / "sub").symlink_to(outside)  # what an older pod (or anything) left there
        sync = _sync(keeper, pod, lines=lines)
        sync.fill()
    assert not os.path.lexists(pod / "up") and not os.path.lexists(pod / "abs")
    assert os.readlink(pod / "latest") == "notes/today", "a link inside is kept"
    assert (pod / "notes" / "today").read_text() == "kept\n"
    assert sorted(os.listdir(outside)) == [], "nothing written through a link"
    said = "\n".join(lines)
    assert "not recreated: the keeper lists up -> '../../outside'" in said, said
    assert "not recreated: the keeper lists abs -> " in said
    assert "not fetched: sub/x" in said
