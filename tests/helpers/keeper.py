"""A real checkpoint keeper (`kubeddp keeper`, its own process on 127.0.0.1) for tests, the job's
secret as a file, raw HTTP for requests no well-behaved client sends, checkpoints written by the
real writer, and a TCP proxy that cuts a connection after so many bytes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kubeddp.trainer.keeper import auth as keeper_auth
from kubeddp.trainer.keeper.client import KeeperClient
from kubeddp.trainer.worker.checkpoint.local import LocalStorage
from tests.helpers import procs
from tests.helpers.ports import free_port


def write_secret(path: Path) -> Path:
    path.write_text(secrets.token_urlsafe(32) + "\n")
    path.chmod(0o600)
    return path


@dataclass
class Keeper:
    root: Path
    port: int
    secret_file: Path | None
    proc: procs.Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def secret(self) -> keeper_auth.Secret | None:
        return keeper_auth.Secret.from_file(str(self.secret_file)) if self.secret_file else None

    def client(self, timeout: float = 30.0) -> KeeperClient:
        return KeeperClient(self.url, self.secret(), timeout=timeout)

    def names(self) -> list[str]:
        """The claim's top-level names, the keeper's own folder aside."""
        return sorted(p.name for p in self.root.iterdir() if p.name != ".kubeddp-keeper")


def keeper_argv(root: Path, port: int, secret_file: Path | None, *extra: str) -> list[str]:
    argv = procs.kubeddp_argv("keeper", "--dir", str(root), "--port", str(port), "--bind",
                              "127.0.0.1", *extra)  # fmt: skip
    return argv + (["--token-file", str(secret_file)] if secret_file else [])


def wait_healthy(port: int, proc: procs.Proc, timeout: float = 60.0) -> None:
    client = KeeperClient(f"http://127.0.0.1:{port}", timeout=5)
    procs.wait_until(client.healthy, timeout, f"the keeper on port {port}", proc)


@contextlib.contextmanager
def keeper_up(
    root: Path,
    log_dir: Path,
    secret_file: Path | None = None,
    *extra: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Keeper]:
    """A keeper serving `root` while the block runs (healthy before it starts), killed after."""
    port = port or free_port()
    log = log_dir / f"keeper-{port}-{time.monotonic_ns()}.log"
    with procs.started(keeper_argv(root, port, secret_file, *extra), log,
                       procs.child_env(env)) as proc:  # fmt: skip
        wait_healthy(port, proc)
        yield Keeper(root, port, secret_file, proc)


def checkpoint(root: Path, step: int, payload: bytes = b"state", size: int = 1000) -> Path:
    """A checkpoint as the trainer writes it (the real writer: digests in COMPLETE)."""
    body = (payload * (size // max(1, len(payload)) + 1))[:size]
    ref = LocalStorage(root).write(
        step,
        {"state.pt": lambda f: f.write(body), "config.yaml": lambda f: f.write(b"train: {}\n")},
    )
    return Path(ref.path)


def signed(
    secret: keeper_auth.Secret | None,
    method: str,
    target: str,
    body: bytes = b"",
    epoch: str = "",
) -> dict[str, str]:
    if secret is None:
        return {}
    digest = hashlib.sha256(body).hexdigest()
    return keeper_auth.request_headers(secret, method, target, digest, epoch)


def epoch_of(port: int, secret: keeper_auth.Secret) -> str:
    """The keeper's epoch, as a pod learns it: from the signed refusal of its first request."""
    headers = {**signed(secret, "GET", "/v2/list"), "Connection": "close"}
    reply = raw_exchange(port, request_bytes("GET", "/v2/list", headers))
    for line in reply.split(b"\r\n\r\n")[0].decode().split("\r\n"):
        name, _, value = line.partition(": ")
        if name.lower() == keeper_auth.EPOCH_HEADER.lower():
            return value
    raise AssertionError(f"no epoch in {reply[:300]!r}")


def raw_exchange(port: int, data: bytes, timeout: float = 10.0, wait_close: bool = True) -> bytes:
    """Send `data` as is; everything the keeper answers until it closes (or `timeout`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if not wait_close:
                    break
        return b"".join(chunks)


def one_reply(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    """Send `data` as is; the keeper's first answer, whole (its status line, headers and the
    body its Content-Length gives), without waiting for a kept-alive connection to close."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        reply = b""
        while b"\r\n\r\n" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
        head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        length = re.search(r"(?im)^content-length:\s*(\d+)\s*$", head)
        want = len(head) + 4 + int(length.group(1)) if length else None  # None: until closed
        while (want is None or len(reply) < want) and (chunk := sock.recv(65536)):
            reply += chunk
        return reply


def request_bytes(method: str, target: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [
        f"{method} {target} HTTP/1.1",
        "Host: keeper",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class CuttingProxy:
    """127.0.0.1:port -> the keeper, passing at most `answers` bytes of the keeper's answers
    and `requests` bytes of what is sent to it on each connection, then closing both sides: a
    connection lost mid-transfer. None: no limit that way."""

    def __init__(self, target_port: int, answers: int | None, requests: int | None = None) -> None:
        self.target_port, self.answers, self.requests = target_port, answers, requests
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cuts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        ends = (client, upstream)
        sending = threading.Thread(target=self._way, args=(client, upstream, self.requests, ends))
        sending.start()
        self._way(upstream, client, self.answers, ends)
        sending.join(30)

    def _way(self, source: socket.socket, dest: socket.socket, limit: int | None, ends) -> None:  # noqa: ANN001
        if not _copy(source, dest, limit):
            self.cuts += 1
        for sock in ends:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._thread.join(5)


def _copy(source: socket.socket, dest: socket.socket, limit: int | None) -> bool:
    """Pass bytes on until the source closes (True) or `limit` bytes went (False)."""
    passed = 0
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            if limit is not None and passed + len(chunk) > limit:
                dest.sendall(chunk[: limit - passed])
                return False
            dest.sendall(chunk)
            passed += len(chunk)
    return True


def tamper(path: Path) -> None:
    """Flip one byte in the middle of a file, keeping its size and time (bit rot)."""
    info = path.stat()
    with open(path, "r+b") as f:
        f.seek(info.st_size // 2)
        byte = f.read(1)
        f.seek(info.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


class DrippingProxy:
    """127.0.0.1:port -> the keeper, passing the answers to requests whose path starts with one
    of `paths` a byte at a time, a byte every 0.2 s (each read of the client gets a byte well
    within any timeout: only a deadline for the whole exchange ends it); other answers pass
    whole. Requests pass whole."""

    def __init__(self, target_port: int, paths: tuple[str, ...] = ("/v2/",)) -> None:
        self.target_port, self.paths = target_port, paths
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                client, _ = self.listener.accept()
                threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError), client:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with upstream:
                first = client.recv(65536)
                path = first.split(b" ", 2)[1].decode(errors="replace") if b" " in first else ""
                upstream.sendall(first)
                threading.Thread(target=_copy, args=(client, upstream, None), daemon=True).start()
                drip = path.startswith(self.paths)
                while not self._stop.is_set() and (chunk := upstream.recv(65536)):
                    for at in range(len(chunk)) if drip else ():
                        if self._stop.wait(0.2):
                            return
                        client.sendall(chunk[at : at + 1])
                    if not drip:
                        client.sendall(chunk)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
