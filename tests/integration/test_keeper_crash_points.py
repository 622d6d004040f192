"""Nothing lost, whatever is killed when: the writer, the pod's send and the keeper's commit are
each SIGKILLed at every step (trainer/fault_points.py), and a connection is cut mid-transfer.
After each, the step saved again is there as its old copy or its new one, whole (every file
matches the digests its COMPLETE records), never neither and never a mix; the keeper's record
of it matches its files; and a fresh pod fetches one whole version."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubeddp.trainer.checkpoint_digest import ENV_BLOCK_BYTES as BLOCKS
from kubeddp.trainer.checkpoint_digest import digest_file, read_marker
from kubeddp.trainer.keeper.client import KeeperClient, KeeperError
from kubeddp.trainer.keeper.sync import CheckpointSync, SyncSettings
from kubeddp.trainer.worker.checkpoint.local import LocalStorage
from tests.helpers import procs
from tests.helpers.keeper import CuttingProxy, keeper_up, write_secret
from tests.helpers.keeper_actor import state
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(300)
STEP, NAME = 5, "ckpt-00000005"
SIZE = 3 * (1 << 20) + 123  # several blocks of the keeper's transfers (1 MiB blocks below)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MiB blocks: several per file, so a kill can land between two of them."""
    monkeypatch.setenv(BLOCKS, str(1 << 20))


def _actor(tmp_path: Path, kill_at: str, *args: str) -> procs.Finished:
    argv = [*procs.kubeddp_argv()[:1], "-m", "tests.helpers.keeper_actor", *args]
    env = procs.child_env({"KUBEDDP_TEST_KILL_AT": kill_at, BLOCKS: str(1 << 20)})
    return procs.run(argv, tmp_path / f"actor-{kill_at}.log", 120, env)


def _whole(unit: Path) -> bytes:
    """The checkpoint's state.pt after checking every file against its COMPLETE marker."""
    recorded = read_marker((unit / "COMPLETE").read_text())
    assert recorded, f"{unit}: a marker without digests"
    for name, digest in recorded.items():
        assert digest_file(unit / name) == digest, f"{unit}/{name} is not what COMPLETE records"
    return (unit / "state.pt").read_bytes()


def _one_version(unit: Path) -> str:
    body = _whole(unit)
    versions = {state("o", SIZE): "old", state("n", SIZE): "new"}
    assert body in versions, f"{unit}/state.pt is neither the old nor the new save"
    return versions[body]


@pytest.mark.parametrize(
    "kill_at", ["save-files-written", "save-marked", "save-old-aside", "save-renamed"]
)
def test_a_writer_killed_at_any_step_of_a_resave_leaves_the_old_or_the_new(
    tmp_path: Path, kill_at: str
) -> None:
    ck = tmp_path / "ck"
    assert _actor(tmp_path, "none", "save", str(ck), str(STEP), "o", str(SIZE)).code == 0
    killed = _actor(tmp_path, kill_at, "save", str(ck), str(STEP), "n", str(SIZE))
    assert killed.code == -9, killed.output
    storage = LocalStorage(ck)
    storage.prepare()  # the next writer (a restarted rank 0)
    (ref,) = storage.list()
    version = _one_version(Path(ref.path))
    assert version == ("new" if kill_at == "save-renamed" else "old")
    storage.write(6, {"state.pt": lambda f: f.write(b"x")})
    storage.remove_partial()
    assert sorted(p.name for p in ck.glob("ckpt-*")) == [NAME, "ckpt-00000006"]
    assert not list(ck.glob(".tmp-ckpt-*")) and not list(ck.glob(".kubeddp-aside-*"))
    storage.release()


def _pod(tmp_path: Path, name: str, fill: str) -> Path:
    """A pod's checkpoint.dir holding step 5 saved with `fill`."""
    from tests.helpers.keeper_actor import save

    save(str(tmp_path / name), STEP, fill, SIZE)
    return tmp_path / name


def _keeper_holds_one_version(root: Path) -> str:
    """The claim's step 5 is whole and its keeper record matches its files."""
    unit = root / NAME
    version = _one_version(unit)
    record = json.loads((unit / ".kubeddp-keeper.json").read_text())
    assert set(record["files"]) == {"state.pt", "config.yaml", "COMPLETE"}, record
    for rel, entry in record["files"].items():
        assert digest_file(unit / rel).to_json() == {
            k: entry[k] for k in ("size", "block", "algorithm", "blocks")
        }
    assert not os.listdir(root / ".kubeddp-keeper" / "aside")
    return version


def _fresh_fill(keeper_url: str, secret: Path, where: Path) -> str:
    from kubeddp.trainer.keeper.auth import Secret

    client = KeeperClient(keeper_url, Secret.from_file(str(secret)), timeout=30)
    sync = CheckpointSync(client, where, lambda line: None, SyncSettings(reads=True))
    sync.fill()
    client.close()
    return _one_version(where / NAME)


@pytest.mark.parametrize(
    "kill_at", ["send-begun", "send-block:2", "send-block:4", "send-committed"]
)
def test_a_pod_killed_at_any_step_of_its_send_leaves_the_keeper_whole(
    tmp_path: Path, kill_at: str
) -> None:
    secret = write_secret(tmp_path / "secret")
    old, new = _pod(tmp_path, "old-pod", "o"), _pod(tmp_path, "new-pod", "n")
    with keeper_up(tmp_path / "claim", tmp_path, secret) as keeper:
        assert _actor(tmp_path, "none", "push", keeper.url, str(secret), str(old)).code == 0
        killed = _actor(tmp_path, kill_at, "push", keeper.url, str(secret), str(new))
        assert killed.code == -9, killed.output
        version = _keeper_holds_one_version(keeper.root)
        assert version == ("new" if kill_at == "send-committed" else "old")
        assert _fresh_fill(keeper.url, secret, tmp_path / "reader-1") == version
        again = _actor(tmp_path, "none", "push", keeper.url, str(secret), str(new))
        assert again.code == 0, again.output  # the restarted pod sends it whole
        assert _keeper_holds_one_version(keeper.root) == "new"
        assert _fresh_fill(keeper.url, secret, tmp_path / "reader-2") == "new"


@pytest.mark.parametrize(
    "kill_at",
    ["keeper-commit-sealed", "keeper-commit-aside", "keeper-commit-renamed", "keeper-prune"],
)
def test_a_keeper_killed_at_any_step_of_a_commit_leaves_the_old_or_the_new(
    tmp_path: Path, kill_at: str
) -> None:
    secret, root, port = write_secret(tmp_path / "secret"), tmp_path / "claim", free_port()
    old, new = _pod(tmp_path, "old-pod", "o"), _pod(tmp_path, "new-pod", "n")
    if kill_at == "keeper-prune":  # an older checkpoint to prune (keep=2 below: two newer)
        from tests.helpers.keeper_actor import save

        save(str(old), 4, "p", 1000)
        save(str(new), 6, "q", 1000)
    with keeper_up(root, tmp_path, secret, port=port) as keeper:
        assert _actor(tmp_path, "none", "push", keeper.url, str(secret), str(old)).code == 0
    env = {"KUBEDDP_TEST_KILL_AT": kill_at}
    with keeper_up(root, tmp_path, secret, port=port, env=env) as keeper:
        failed = _actor(tmp_path, "none", "push", keeper.url, str(secret), str(new))
        assert failed.code != 0 and "unreachable" in failed.output, failed.output
        procs.wait_until(lambda: keeper.proc.poll() is not None, 60, "the keeper's SIGKILL")
    with keeper_up(root, tmp_path, secret, port=port) as keeper:
        version = _keeper_holds_one_version(root)  # after the restart's recovery
        assert version == ("old" if kill_at in ("keeper-commit-sealed", "keeper-commit-aside")
                           else "new")  # fmt: skip
        assert not os.listdir(root / ".kubeddp-keeper" / "incoming")
        assert not os.listdir(root / ".kubeddp-keeper" / "trash")
        again = _actor(tmp_path, "none", "push", keeper.url, str(secret), str(new))
        assert again.code == 0, again.output
        assert _keeper_holds_one_version(root) == "new"
        if kill_at == "keeper-prune":
            assert sorted(p.name for p in root.glob("ckpt-*")) == [NAME, "ckpt-00000006"]


def test_a_connection_cut_mid_transfer_never_leaves_a_file_or_a_commit(tmp_path: Path) -> None:
    """A fetch whose blocks keep being cut saves nothing (not the file, not a staging folder);
    a send cut mid-block commits nothing and the pod does not count it as sent."""
    secret = write_secret(tmp_path / "secret")
    pod = _pod(tmp_path, "pod", "n")
    with keeper_up(tmp_path / "claim", tmp_path, secret) as keeper:
        lines: list[str] = []
        cut_sends = CuttingProxy(keeper.port, answers=None, requests=(1 << 20) // 2)
        sender = CheckpointSync(KeeperClient(cut_sends.url, keeper.secret(), timeout=20), pod,
                                lines.append, SyncSettings(reads=True))  # fmt: skip
        with pytest.raises(KeeperError):
            sender.push(final=True)
        assert cut_sends.cuts and not (keeper.root / NAME).exists()
        assert NAME not in sender.units
        cut_sends.close()
        direct = CheckpointSync(keeper.client(), pod, lines.append, SyncSettings(reads=True))
        assert direct.push(final=True) == [NAME]
        cut_fetches = CuttingProxy(keeper.port, answers=(1 << 20) // 2)
        cut_client = KeeperClient(cut_fetches.url, keeper.secret(), timeout=20)
        reader = CheckpointSync(cut_client, tmp_path / "reader", lines.append, SyncSettings(True))
        with pytest.raises(KeeperError):
            reader.fill()
        assert cut_fetches.cuts
        assert not list((tmp_path / "reader").iterdir())  # no file, no staging
        cut_fetches.close()
