"""The checkpoint keeper as an adversary meets it: a real `kubeddp keeper` process on 127.0.0.1,
spoken to through raw sockets where a well-behaved client would not go. Unsigned, forged,
replayed and stale requests are refused; framing that could smuggle a request is refused and
the connection closed; slow, idle and excess connections are cut; links on the claim are never
followed; an upload is committed only whole, with blocks that match their digests, or not at
all, also when the disk fills or the keeper restarts mid-upload."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubeddp.trainer.checkpoint_digest import MIN_BLOCK_BYTES, BlockHasher, marker_text
from kubeddp.trainer.keeper import auth as keeper_auth
from kubeddp.trainer.keeper.client import KeeperClient, KeeperRefused
from kubeddp.trainer.keeper.local_dir import scan
from kubeddp.trainer.keeper.protocol import FileEntry, Upload
from kubeddp.trainer.keeper.sync import unit_upload
from tests.helpers import procs
from tests.helpers.keeper import (
    checkpoint,
    epoch_of,
    keeper_argv,
    keeper_up,
    one_reply,
    raw_exchange,
    request_bytes,
    signed,
    wait_healthy,
    write_secret,
)
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(180)


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else -1


def _file_upload(path: Path, rel: str, block: int = MIN_BLOCK_BYTES) -> Upload:
    hasher = BlockHasher(block)
    hasher.update(path.read_bytes())
    return Upload("file", rel, {rel: FileEntry(hasher.finish(), 0)}, None)


def test_every_request_but_the_health_check_needs_the_jobs_signature(tmp_path: Path) -> None:
    secret_file = write_secret(tmp_path / "secret")
    with keeper_up(tmp_path / "claim", tmp_path, secret_file) as keeper:
        secret = keeper.secret()
        assert _status(one_reply(keeper.port, request_bytes("GET", "/healthz", {}))) == 200
        unsigned = one_reply(keeper.port, request_bytes("GET", "/v2/list", {}))
        assert _status(unsigned) == 401 and b"not signed" in unsigned
        forged = signed(keeper_auth.Secret(b"an-attacker's-guess-0123456789"), "GET", "/v2/list")
        assert _status(one_reply(keeper.port, request_bytes("GET", "/v2/list", forged))) == 401
        epoch = epoch_of(keeper.port, secret)
        once = signed(secret, "GET", "/v2/list", epoch=epoch)
        assert _status(one_reply(keeper.port, request_bytes("GET", "/v2/list", once))) == 200
        replayed = one_reply(keeper.port, request_bytes("GET", "/v2/list", once))
        assert _status(replayed) == 401 and b"replay" in replayed
        stale = dict(signed(secret, "GET", "/v2/list", epoch=epoch))
        stale[keeper_auth.DATE_HEADER] = str(int(time.time()) - 3600)
        stale["Authorization"] = _resign(secret, "GET", "/v2/list", stale)
        reply = one_reply(keeper.port, request_bytes("GET", "/v2/list", stale))
        assert _status(reply) == 401 and b"clock" in reply
        value = secret_file.read_text().strip()
        assert value not in procs.cmdline(keeper.proc.pid)
        client = keeper.client()
        checkpoint(tmp_path / "pod", 1)
        assert client.listing().units == {}
    assert value not in keeper.proc.output()  # nor in its log
    assert "refused (401)" in keeper.proc.output()


@pytest.mark.parametrize(
    "headers, status",
    [
        ({"Transfer-Encoding": "chunked"}, 411),
        ({}, 411),  # no Content-Length
        ({"Content-Length": "-5"}, 400),
        ({"Content-Length": "5, 5"}, 400),
        ({"Content-Length": "0x10"}, 400),
    ],
)
def test_framing_that_could_smuggle_a_request_is_refused_and_the_connection_closed(
    tmp_path: Path, headers: dict[str, str], status: int
) -> None:
    """A second request hidden in the body is never answered: one status line comes back."""
    with keeper_up(tmp_path / "claim", tmp_path) as keeper:
        smuggled = request_bytes("DELETE", "/v2/file/victim", {"Content-Length": "0"})
        (keeper.root / "victim").write_text("keep me")
        reply = raw_exchange(keeper.port, request_bytes("PUT", "/v2/link/x", headers) + smuggled)
        assert _status(reply) == status, reply
        assert reply.count(b"HTTP/1.1 ") == 1, reply
        assert (keeper.root / "victim").read_text() == "keep me"
        assert not os.path.lexists(keeper.root / "x")


def test_oversized_request_lines_and_headers_are_refused(tmp_path: Path) -> None:
    with keeper_up(tmp_path / "claim", tmp_path) as keeper:
        huge = {f"X-Pad-{i}": "a" * 1000 for i in range(40)}
        assert _status(raw_exchange(keeper.port, request_bytes("GET", "/healthz", huge))) == 431
        line = request_bytes("GET", "/healthz?" + "a" * 40_000, {})
        assert _status(raw_exchange(keeper.port, line)) == 431


def test_idle_trickling_and_stalled_connections_are_closed(tmp_path: Path) -> None:
    secret_file = write_secret(tmp_path / "secret")
    with keeper_up(tmp_path / "claim", tmp_path, secret_file, "--idle-seconds", "1") as keeper:
        with socket.create_connection(("127.0.0.1", keeper.port), timeout=30) as idle:
            assert idle.recv(100) == b""  # closed by the keeper, not by this timeout
        request = request_bytes("GET", "/healthz", {"X-Pad": "a" * 200})
        with socket.create_connection(("127.0.0.1", keeper.port), timeout=30) as trickle:
            sent = 0
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                for byte in request:  # a byte every 0.2 s: 50 s for all of it
                    trickle.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.2)
                    if sent > 8:  # the 1 s deadline has passed by now: the keeper hung up
                        trickle.sendall(b"x" * 100_000)
        client = keeper.client()
        body = os.urandom(MIN_BLOCK_BYTES)
        (tmp_path / "blob").write_bytes(body)
        upload = _file_upload(tmp_path / "blob", "blob")
        txn = json.loads(client.request("POST", "/v2/txn", json.dumps(upload.to_json()).encode()))
        target = f"/v2/txn/{txn['txn']}/0/0"
        headers = signed(
            keeper.secret(), "PUT", target, b"", epoch_of(keeper.port, keeper.secret())
        )
        headers |= {keeper_auth.BODY_HEADER: upload.files["blob"].digest.blocks[0],
                    "Content-Length": str(len(body))}  # fmt: skip
        # (the signature covers the body digest, which the keeper checks against the block's)
        headers["Authorization"] = _resign(keeper.secret(), "PUT", target, headers)
        with socket.create_connection(("127.0.0.1", keeper.port), timeout=30) as stalled:
            stalled.sendall(request_bytes("PUT", target, headers) + body[: len(body) // 2])
            assert stalled.recv(100) == b""  # the keeper gave up on the rest
        with pytest.raises(KeeperRefused, match="409"):
            client.request("POST", f"/v2/txn/{txn['txn']}/commit", b"")
        assert not (keeper.root / "blob").exists()


def _resign(secret, method: str, target: str, headers: dict[str, str]) -> str:  # noqa: ANN001
    text = keeper_auth._request_text(method, target, headers[keeper_auth.DATE_HEADER],
                                     headers[keeper_auth.NONCE_HEADER],
                                     headers[keeper_auth.BODY_HEADER],
                                     headers[keeper_auth.EPOCH_HEADER])  # fmt: skip
    return f"{keeper_auth.SCHEME} {secret.sign(text)}"


def test_connections_and_requests_beyond_the_caps_are_turned_away(tmp_path: Path) -> None:
    caps = ("--max-connections", "3", "--max-requests", "1", "--idle-seconds", "300")
    with keeper_up(tmp_path / "claim", tmp_path, None, *caps) as keeper:
        client = keeper.client()
        (tmp_path / "blob").write_bytes(os.urandom(MIN_BLOCK_BYTES))
        upload = _file_upload(tmp_path / "blob", "blob")
        txn = json.loads(client.request("POST", "/v2/txn", json.dumps(upload.to_json()).encode()))
        client.close()  # its kept-alive connection would count
        head = request_bytes("PUT", f"/v2/txn/{txn['txn']}/0/0",
                             {"Content-Length": str(MIN_BLOCK_BYTES)})  # fmt: skip

        def held(sending: bytes) -> socket.socket | None:
            """A connection the keeper holds, having sent `sending` (None: turned away)."""
            sock = socket.create_connection(("127.0.0.1", keeper.port), timeout=30)
            sock.sendall(sending)
            time.sleep(0.5)
            sock.setblocking(False)
            try:
                sock.recv(1)
            except BlockingIOError:
                return sock  # no answer: it holds its connection (and a request slot)
            sock.close()
            return None

        # a request in progress, its body stalled
        busy = procs.wait_until(lambda: held(head + b"x"), 60, "a request that holds the slot")
        seen: list[bytes] = []

        def listing_status() -> bytes:
            listing = request_bytes("GET", "/v2/list", {"Connection": "close"})
            reply = raw_exchange(keeper.port, listing)
            seen.append(reply[:80])
            return reply if _status(reply) == 503 else b""

        second = procs.wait_until(listing_status, 60, "a 503 while the busy request holds")
        assert b"Retry-After: 1" in second, second
        health = request_bytes("GET", "/healthz", {"Connection": "close"})
        assert _status(raw_exchange(keeper.port, health)) == 200
        # when full, the silent connection that waited longest is closed to make room for
        # the health check (a flood of silent connections needs no secret)...
        silent = [procs.wait_until(lambda: held(b""), 60, "a silent one") for _ in range(2)]
        time.sleep(1.5)  # they have waited long enough to give way
        procs.wait_until(lambda: _status(raw_exchange(keeper.port, health)) == 200, 60, "room")
        silent[0].settimeout(10)
        assert silent[0].recv(100) == b"", "the first silent connection was closed"
        for sock in (busy, *silent):
            sock.close()

        def proven_idle() -> socket.socket | None:
            """A connection that made a request (keeper without a secret: any), now idle."""
            sock = socket.create_connection(("127.0.0.1", keeper.port), timeout=30)
            sock.sendall(request_bytes("GET", "/v2/list", {}))
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:  # turned away (503): the busy one has not let go yet
                    sock.close()
                    return None
                reply += chunk
            return sock

        # ...one that made a request is not: with every connection used, 503 at once
        idle = [procs.wait_until(proven_idle, 60, "a connection that made a request")
                for _ in range(3)]  # fmt: skip

        def fourth_refused() -> bool:
            seen.append(raw_exchange(keeper.port, health)[:60])
            return _status(seen[-1]) == 503

        try:
            procs.wait_until(fourth_refused, 60, "a fourth connection refused at once")
        except AssertionError:
            raise AssertionError(f"{seen[-5:]} {keeper.proc.output()}") from None
        for sock in idle:
            sock.close()


def test_links_on_the_claim_are_listed_and_never_followed(tmp_path: Path) -> None:
    claim, outside = tmp_path / "claim", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the node's")
    claim.mkdir()
    (claim / "out").symlink_to(outside)
    (claim / "pw").symlink_to(outside / "secret.txt")
    with keeper_up(claim, tmp_path) as keeper:
        client = keeper.client()
        listing = client.listing()
        assert listing.links == {"out": str(outside), "pw": str(outside / "secret.txt")}
        assert listing.files == {}
        block = {"Range": "bytes=0-3", "X-Kubeddp-Version": "x"}
        reply = one_reply(keeper.port, request_bytes("GET", "/v2/file/pw", block))
        assert _status(reply) == 404 and b"the node's" not in reply
        reply = one_reply(keeper.port, request_bytes("GET", "/v2/file/out/secret.txt", block))
        assert _status(reply) == 409 and b"the node's" not in reply
        (tmp_path / "x").write_bytes(b"planted")
        with pytest.raises(KeeperRefused, match="409"):
            client.upload(_file_upload(tmp_path / "x", "out/x"), {"out/x": tmp_path / "x"})
        with pytest.raises(KeeperRefused, match="400"):
            client.link("up", "../../outside")
        assert sorted(os.listdir(outside)) == ["secret.txt"]


@pytest.mark.parametrize("where", ["/", "", "/etc", "/proc/1", "/usr/", "/dev/shm"])
def test_the_keeper_refuses_system_directories(where: str) -> None:
    argv = [sys.executable, "-m", "kubeddp", "keeper", "--dir", where, "--port", str(free_port())]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--dir" in lines[0], done.stderr


def test_blocks_are_checked_on_arrival_and_a_commit_needs_all_of_them(tmp_path: Path) -> None:
    with keeper_up(tmp_path / "claim", tmp_path, write_secret(tmp_path / "s")) as keeper:
        client = keeper.client()
        blob = tmp_path / "blob"
        blob.write_bytes(os.urandom(2 * MIN_BLOCK_BYTES))
        upload = _file_upload(blob, "blob")
        blob.write_bytes(os.urandom(2 * MIN_BLOCK_BYTES))  # not what the digests say
        with pytest.raises(KeeperRefused, match="422"):
            client.upload(upload, {"blob": blob})
        assert not (keeper.root / "blob").exists()
        assert os.listdir(keeper.root / ".kubeddp-keeper" / "incoming") == []  # aborted
        pod = tmp_path / "pod"
        ckpt = checkpoint(pod, 3, size=3000)
        marker = marker_text(3, {"state.pt": BlockHasher().finish()})  # says: an empty state.pt
        (ckpt / "COMPLETE").write_text(marker)
        files = {f"ckpt-00000003/{p.name}": p for p in ckpt.iterdir()}
        entries = {}
        for rel, path in files.items():
            hasher = BlockHasher()
            hasher.update(path.read_bytes())
            entries[rel] = FileEntry(hasher.finish(), 0)
        with pytest.raises(KeeperRefused, match="422.*COMPLETE"):
            client.upload(Upload("unit", "ckpt-00000003", entries, None), files)
        assert not (keeper.root / "ckpt-00000003").exists()


def test_a_full_disk_is_507_and_leaves_no_part(tmp_path: Path) -> None:
    """Two uploads that each fit begin at once; the disk fills under the second: it hears 507,
    its staged part goes at once, the first one commits whole."""
    from tests.helpers.mounts import tmpfs

    with tmpfs(tmp_path / "small", "12m") as claim, keeper_up(claim, tmp_path) as keeper:
        client = keeper.client()
        big = tmp_path / "big"
        big.write_bytes(os.urandom(20 << 20))
        with pytest.raises(KeeperRefused, match="507"):
            client.upload(_file_upload(big, "big"), {"big": big})
        halves = []
        for name in ("a", "b"):
            (tmp_path / name).write_bytes(os.urandom(7 << 20))  # each fits; not both
            halves.append(_file_upload(tmp_path / name, name))
        begun = [
            json.loads(client.request("POST", "/v2/txn", json.dumps(u.to_json()).encode()))["txn"]
            for u in halves
        ]
        client._send_blocks(begun[0], halves[0], {"a": tmp_path / "a"})
        with pytest.raises(KeeperRefused, match="507"):
            client._send_blocks(begun[1], halves[1], {"b": tmp_path / "b"})
        assert os.listdir(claim / ".kubeddp-keeper" / "incoming") == [begun[0]]
        client.request("POST", f"/v2/txn/{begun[0]}/commit", b"")
        assert (claim / "a").read_bytes() == (tmp_path / "a").read_bytes()
        assert not (claim / "b").exists()


def test_a_keeper_restarted_mid_upload_forgets_it_and_the_upload_begins_again(
    tmp_path: Path,
) -> None:
    """What a dead keeper staged is never committed: the old upload is unknown (404), so a
    checkpoint without COMPLETE can never appear; the client begins again and commits whole."""
    secret, root, port = write_secret(tmp_path / "s"), tmp_path / "claim", free_port()
    pod = tmp_path / "pod"
    ckpt = checkpoint(pod, 6, size=3 * MIN_BLOCK_BYTES)
    from kubeddp.trainer.keeper.local_dir import scan
    from kubeddp.trainer.keeper.sync import unit_upload

    upload = unit_upload(pod, ckpt.name, scan(pod).units[ckpt.name], None)
    sources = {rel: pod / rel for rel in upload.files}
    with keeper_up(root, tmp_path, secret, port=port) as keeper:
        client = keeper.client()
        txn = json.loads(client.request("POST", "/v2/txn", json.dumps(upload.to_json()).encode()))
        marker_no = upload.order.index(f"{ckpt.name}/COMPLETE")
        client._put_block(txn["txn"], marker_no, upload.files[upload.order[marker_no]], 0,
                          sources[upload.order[marker_no]])  # fmt: skip
    with procs.started(keeper_argv(root, port, secret), tmp_path / "again.log") as again:
        wait_healthy(port, again)
        with pytest.raises(KeeperRefused, match="404"):
            client.request("POST", f"/v2/txn/{txn['txn']}/commit", b"")
        assert not (root / ckpt.name).exists()
        assert os.listdir(root / ".kubeddp-keeper" / "incoming") == []
        client.upload(upload, sources)
        for rel in upload.files:
            assert (
                hashlib.sha256((root / rel).read_bytes()).digest()
                == hashlib.sha256(sources[rel].read_bytes()).digest()
            )


def test_an_unsigned_keeper_and_a_signing_pod_do_not_talk(tmp_path: Path) -> None:
    """A pod with the job's secret never takes answers that are not signed with it."""
    with keeper_up(tmp_path / "claim", tmp_path) as keeper:
        client = KeeperClient(keeper.url, keeper_auth.Secret(b"0123456789abcdef0123"))
        with pytest.raises(Exception, match="not signed with the job's keeper secret"):
            client.listing()


def test_nothing_is_added_linked_or_removed_inside_a_committed_checkpoint(tmp_path: Path) -> None:
    """Signed clients once could upload a loose file into ckpt-N/ (and plant ckpt-M/COMPLETE,
    a checkpoint the keeper never checked). A checkpoint's name is committed whole or not at
    all: a file, a link or a delete under it is refused, whatever its name."""
    secret_file = write_secret(tmp_path / "secret")
    with keeper_up(tmp_path / "claim", tmp_path, secret_file) as keeper:
        client = keeper.client()
        pod = tmp_path / "pod"
        checkpoint(pod, 4)
        (pod / "x").write_bytes(b"planted")
        view = scan(pod)
        client.upload(unit_upload(pod, "ckpt-00000004", view.units["ckpt-00000004"], 3),
                      {r: pod / r for r in view.units["ckpt-00000004"]})  # fmt: skip
        for rel, status in (("ckpt-00000004/extra.pt", "400"), ("ckpt-00000099/COMPLETE", "400"),
                            ("ckpt-00000004.bad/x", "400")):  # fmt: skip
            with pytest.raises(KeeperRefused, match=status):
                client.upload(_file_upload(pod / "x", rel), {rel: pod / "x"})
        with pytest.raises(KeeperRefused, match="403"):
            client.link("ckpt-00000004/latest", "state.pt")
        with pytest.raises(KeeperRefused, match="403"):
            client.delete("ckpt-00000004/state.pt")
        # a checkpoint of another name (a unit of a script's) is whole as well
        (pod / "mine").mkdir()
        (pod / "mine" / "COMPLETE").write_text("done\n")
        mine = scan(pod).units["mine"]
        client.upload(unit_upload(pod, "mine", mine, 3), {r: pod / r for r in mine})
        with pytest.raises(KeeperRefused, match="403"):
            client.upload(_file_upload(pod / "x", "mine/x"), {"mine/x": pod / "x"})
        assert sorted(os.listdir(keeper.root / "ckpt-00000004")) == [
            ".kubeddp-keeper.json", "COMPLETE", "config.yaml", "state.pt"
        ]  # fmt: skip
        assert not (keeper.root / "ckpt-00000099").exists()
        assert client.listing().units.keys() == {"ckpt-00000004", "mine"}


def test_a_request_captured_before_a_keeper_restart_is_refused_after_it(tmp_path: Path) -> None:
    """The keeper remembers nonces in memory only: a captured signed request, sent again after
    a restart, succeeded once. Each start draws a new epoch, and a request is good only for the
    epoch it was signed for; the pods learn the new one from a signed refusal and go on."""
    secret_file = write_secret(tmp_path / "secret")
    claim, port = tmp_path / "claim", free_port()
    with keeper_up(claim, tmp_path, secret_file, port=port) as keeper:
        secret = keeper.secret()
        (claim / "notes.txt").write_text("first\n")
        target = "/v2/file/notes.txt"
        captured = request_bytes(
            "DELETE", target, signed(secret, "DELETE", target, epoch=epoch_of(port, secret))
        )
        assert _status(raw_exchange(port, captured)) == 200
        assert _status(raw_exchange(port, captured)) == 401, "a replay, the same start"
        client = keeper.client()
        client.listing()
    (claim / "notes.txt").write_text("second\n")
    with keeper_up(claim, tmp_path, secret_file, port=port):
        reply = raw_exchange(port, captured)
        assert _status(reply) == 401 and b"another start of the keeper" in reply, reply
        assert (claim / "notes.txt").read_text() == "second\n", "the replay deleted nothing"
        assert "notes.txt" in client.listing().files, "the pod's client learnt the new epoch"


def test_a_pod_whose_clock_is_off_signs_with_the_keepers_time_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod clock 1000 s off was refused as a wrong secret (exit 2, fatal), though a retry on
    another node would have worked. It learns the keeper's time from its signed refusal and
    says the skew in one line."""
    secret_file = write_secret(tmp_path / "secret")
    with keeper_up(tmp_path / "claim", tmp_path, secret_file) as keeper:
        lines: list[str] = []
        client = keeper.client()
        client.log = lines.append
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() - 1000)  # this process's clock only
        assert client.listing().units == {}
        client.listing()
    assert len(lines) == 1 and "NTP" in lines[0], lines
    said = re.search(r"this pod's clock is (\d+) s behind the keeper's", lines[0])
    assert said and 998 <= int(said.group(1)) <= 1001, lines  # the keeper's time is whole seconds


def test_a_flood_of_silent_connections_leaves_the_health_check_and_the_pods_served(
    tmp_path: Path,
) -> None:
    """Hundreds of connections that never send a byte, from one address and from many (no
    secret needed): each address gets at most --max-client-connections (16) and the 17th, the
    131st and the 300th get the documented 503 at once; when the keeper is full, the silent
    connection that waited longest gives way, so the health check and a signed request still
    get through."""
    secret_file = write_secret(tmp_path / "secret")
    with keeper_up(tmp_path / "claim", tmp_path, secret_file) as keeper:
        flood: list[socket.socket] = []
        turned_away = 0
        try:
            for n in range(300):  # one address
                sock = socket.create_connection(("127.0.0.1", keeper.port), timeout=10,
                                                source_address=("127.0.0.2", 0))  # fmt: skip
                flood.append(sock)
                if n in (16, 130, 299):
                    reply = sock.recv(200)  # at once: the accepting thread never waits
                    assert _status(reply) == 503 and b"Retry-After: 1" in reply, (n, reply)
                    turned_away += 1
            for host in range(3, 23):  # twenty more addresses, 16 each: 320 more than fit
                source = (f"127.0.0.{host}", 0)
                for _ in range(16):
                    flood.append(socket.create_connection(("127.0.0.1", keeper.port), timeout=10,
                                                          source_address=source))  # fmt: skip
            time.sleep(1.5)  # the silent ones have waited long enough to give way
            health = request_bytes("GET", "/healthz", {"Connection": "close"})
            assert _status(raw_exchange(keeper.port, health)) == 200
            assert keeper.client().listing().units == {}, "a signed request is served"
        finally:
            for sock in flood:
                sock.close()
    assert turned_away == 3
