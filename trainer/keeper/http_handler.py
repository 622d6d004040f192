"""The checkpoint keeper's HTTP side: what a request may look like, how long it may take, how
many there may be, and who may make it.

- Every request but /healthz carries the job's signature (keeper/auth.py): else 401.
- Framing is strict: a PUT or POST needs one Content-Length of plain digits (chunked or missing:
  411; negative, repeated or garbage: 400), a GET or DELETE has no body, and every refusal of
  the framing closes the connection, so no second request can hide in a body. The request line
  and headers are bounded (32 KiB: 431), and so is every body (a block, or 8 MiB of JSON: 413).
- Time is bounded: the request line and headers must arrive within the idle time, a body at
  no less than 1 MB/s on top of it, and a connection idle that long is closed.
- At most `max_client_connections` connections from one address and `max_connections` in all:
  when full, the connection that has waited longest for a request line without ever making a
  signed one is closed to make room (a flood of silent connections, which needs no secret, must
  not shut out the health check and the pods); when there is none, 503 at once, never waiting
  in the accepting thread. At most `max_requests` requests in progress (beyond: 503 with
  Retry-After); /healthz takes no request slot.
- A block is sent with sendfile(2): the keeper's CPU does not touch fetched bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from kubeddp.trainer.checkpoint_digest import DigestError
from kubeddp.trainer.keeper import auth as keeper_auth
from kubeddp.trainer.keeper.protocol import (
    API,
    HEALTH,
    KEEPER_DIR,
    MAX_JSON_BYTES,
    VERSION_HEADER,
    BadPath,
    Upload,
    relative_path,
)
from kubeddp.trainer.keeper.store import Store, StoreError
from kubeddp.trainer.keeper.uploads import Uploads

DIGITS = re.compile(r"^[0-9]{1,15}$")
RANGE = re.compile(r"^bytes=([0-9]{1,15})-([0-9]{1,15})$")
SEND_CHUNK = 16 << 20
LINGER_SECONDS = 2.0
LINGER_BYTES = 1 << 20
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


@dataclass(frozen=True)
class Limits:
    idle_seconds: float = 60.0
    min_bytes_per_second: float = 1e6
    max_header_bytes: int = 32 << 10
    max_connections: int = 128
    max_requests: int = 32
    # one address (a pod; the kubelet's probes come from the node's): a pod's client holds 5
    max_client_connections: int = 16


# A connection waiting this long for a request line, with no signed request made yet, may be
# closed to make room for a new one when the keeper is full: a flood of connections that send
# nothing (no secret needed) must not shut out the health check and the pods.
EVICT_AFTER_SECONDS = 1.0
MAX_LINGERING = 64  # refused connections closed gently at once; beyond, closed at once


@dataclass
class Connection:
    """What the keeper knows of one held connection."""

    client: str  # its address
    since: float  # when it began to wait for its next request line
    waiting: bool = True
    proven: bool = False  # it made a signed request (or any, on a keeper without a secret)
    evicted: bool = False


@dataclass
class Keeper:
    """What a request is served from."""

    store: Store
    uploads: Uploads
    check: keeper_auth.RequestCheck | None
    limits: Limits


class Refused(Exception):
    def __init__(self, status: int, message: str, close: bool = False, code: str = "") -> None:
        super().__init__(message)
        self.status, self.close, self.code = status, close, code  # code: X-Kubeddp-Refusal


class DeadlineSocket(io.RawIOBase):
    """A socket read with a per-read idle timeout and an optional deadline for the whole
    request: a client trickling a byte at a time cannot hold the connection."""

    def __init__(self, sock: socket.socket, idle: float) -> None:
        self.sock, self.idle, self.deadline = sock, idle, None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        timeout = self.idle
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                raise TimeoutError("the request took longer than its deadline")
        self.sock.settimeout(timeout)
        return self.sock.recv_into(buffer)


class HeaderBudget(io.BufferedReader):
    """Lines (the request line and headers) count against a budget per request."""

    budget = 0

    def readline(self, size: int | None = -1) -> bytes:
        allowed = self.budget + 1 if size is None or size < 0 else min(size, self.budget + 1)
        line = super().readline(max(allowed, 0))
        self.budget -= len(line)
        return line


class KeeperServer(ThreadingHTTPServer):
    """Threads per connection, within the caps: at most `max_client_connections` from one
    address and `max_connections` in all; when full, the longest-waiting connection that has
    made no signed request is closed to make room, and when there is none, 503 at once."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], keeper: Keeper, log) -> None:  # noqa: ANN001
        self.keeper, self.log = keeper, log
        self.connections: dict[socket.socket, Connection] = {}
        self.connections_lock = threading.Lock()
        self.lingering = threading.BoundedSemaphore(MAX_LINGERING)
        self.slots = threading.BoundedSemaphore(keeper.limits.max_requests)
        super().__init__(address, KeeperHandler)

    def process_request(self, request, client_address) -> None:  # noqa: ANN001
        limits, client = self.keeper.limits, client_address[0]
        with self.connections_lock:
            live = [c for c in self.connections.values() if not c.evicted]
            full = sum(1 for c in live if c.client == client) >= limits.max_client_connections
            if not full and len(live) >= limits.max_connections:
                full = not self._evict_one()
            if not full:
                self.connections[request] = Connection(client, time.monotonic())
        if full:
            self._turn_away(request)
            return
        super().process_request(request, client_address)

    def _evict_one(self) -> bool:
        """Close the longest-waiting connection that made no signed request (with the lock)."""
        now = time.monotonic()
        idle = [
            (c.since, sock)
            for sock, c in self.connections.items()
            if c.waiting and not c.proven and not c.evicted and now - c.since >= EVICT_AFTER_SECONDS
        ]
        if not idle:
            return False
        _, sock = min(idle, key=lambda item: item[0])
        self.connections[sock].evicted = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # its thread's read ends; the thread closes it
        return True

    def _turn_away(self, request: socket.socket) -> None:
        """503 at once, never waiting in the accepting thread: the lingering close (so the
        reply is not reset away) runs in a thread of its own, at most MAX_LINGERING at once."""
        with contextlib.suppress(OSError):
            request.setblocking(False)
            request.send(BUSY)
        if self.lingering.acquire(blocking=False):
            threading.Thread(target=self._linger_then_close, args=(request,), daemon=True).start()
        else:
            self.close_request(request)

    def _linger_then_close(self, request: socket.socket) -> None:
        try:
            with contextlib.suppress(OSError):
                request.setblocking(True)
            self.shutdown_request(request)
        finally:
            self.lingering.release()

    def waiting(self, request: socket.socket, waits: bool) -> None:
        with self.connections_lock:
            found = self.connections.get(request)
            if found is not None:
                found.waiting = waits
                found.since = time.monotonic()

    def proven(self, request: socket.socket) -> None:
        with self.connections_lock:
            found = self.connections.get(request)
            if found is not None:
                found.proven = True

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.connections_lock:
                self.connections.pop(request, None)

    def shutdown_request(self, request) -> None:  # noqa: ANN001
        """A lingering close: what the client still sends is read and dropped for a moment, so
        that the kernel does not answer it with a reset that would discard our reply."""
        with contextlib.suppress(OSError):
            request.shutdown(socket.SHUT_WR)
            request.settimeout(LINGER_SECONDS)
            drained = 0
            while drained < LINGER_BYTES and (chunk := request.recv(65536)):
                drained += len(chunk)
        self.close_request(request)

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        self.log(f"[kubeddp] keeper: a connection from {client_address[0]} failed: "
                 f"{sys.exc_info()[1]!r}")  # fmt: skip


class KeeperHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: KeeperServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.deadline_socket = DeadlineSocket(self.connection, self.limits.idle_seconds)
        self.rfile = HeaderBudget(self.deadline_socket, 256 << 10)

    @property
    def limits(self) -> Limits:
        return self.server.keeper.limits

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per request would flood the pod's log; refusals are said below

    def handle_one_request(self) -> None:
        self.deadline_socket.deadline = time.monotonic() + self.limits.idle_seconds
        self.rfile.budget = self.limits.max_header_bytes
        self.nonce, self.refusal = "", ""
        self.server.waiting(self.connection, True)
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError):
            self.close_connection = True

    def parse_request(self) -> bool:
        if not self.raw_requestline.endswith(b"\n"):
            self.command, self.requestline, self.request_version = None, "", "HTTP/1.1"
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request line too long")
            return False
        self.server.waiting(self.connection, False)
        if not super().parse_request():
            return False
        if self.rfile.budget < 0:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "headers too large")
            return False
        if self.request_version != "HTTP/1.1":
            self.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "HTTP/1.1 only")
            return False
        self.deadline_socket.deadline = None
        return True

    def do_GET(self) -> None:  # noqa: N802
        self._serve()

    def do_PUT(self) -> None:  # noqa: N802
        self._serve()

    def do_POST(self) -> None:  # noqa: N802
        self._serve()

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve()

    # ---- one request -------------------------------------------------------------------------
    def _serve(self) -> None:
        self.nonce = self.headers.get(keeper_auth.NONCE_HEADER, "")[:64]
        try:
            length = self._framing()
            if self.command == "GET" and self.path == HEALTH:
                self._reply(HTTPStatus.OK, b"ok\n", sign=False)
                return
            if not self.server.slots.acquire(blocking=False):
                raise Refused(HTTPStatus.SERVICE_UNAVAILABLE, "too many requests; retry", True)
            try:
                self._authorize(length)
                self._route(length)
            finally:
                self.server.slots.release()
        except Refused as exc:
            self.refusal = exc.code
            self._refuse(exc.status, str(exc), exc.close)
        except StoreError as exc:
            self._refuse(exc.status, str(exc), close=self.command == "PUT")
        except (BadPath, DigestError, ValueError) as exc:
            self._refuse(HTTPStatus.BAD_REQUEST, str(exc), close=True)

    def _framing(self) -> int:
        """The body's length; a request that could smuggle another is refused and closed."""
        if self.headers.get_all("Transfer-Encoding"):
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "Transfer-Encoding is not accepted; send "
                          "Content-Length", close=True)  # fmt: skip
        given = self.headers.get_all("Content-Length") or []
        if len(given) > 1 or (given and not DIGITS.match(given[0])):
            raise Refused(HTTPStatus.BAD_REQUEST, "Content-Length must be one number", True)
        if not given and self.command in ("PUT", "POST"):
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required", close=True)
        length = int(given[0]) if given else 0
        if length and self.command in ("GET", "DELETE"):
            raise Refused(HTTPStatus.BAD_REQUEST, f"a {self.command} has no body", close=True)
        return length

    def _authorize(self, length: int) -> None:
        check = self.server.keeper.check
        if check is None:
            self.server.proven(self.connection)
            return
        problem = check.problem(self.command, self.path, self.headers)
        if problem:
            # a pod learning the epoch or the clock signs again on this connection (unless a
            # body, never read, follows: it would be taken for the next request)
            stale = problem.code in (keeper_auth.EPOCH, keeper_auth.CLOCK) and not length
            raise Refused(HTTPStatus.UNAUTHORIZED, problem.line, not stale, problem.code)
        self.server.proven(self.connection)

    def _route(self, length: int) -> None:
        parts = urlsplit(self.path)
        route, query = parts.path, parse_qs(parts.query)
        if not route.startswith(API + "/"):
            raise Refused(HTTPStatus.NOT_FOUND, f"unknown path {route[:100]}", close=bool(length))
        words = route[len(API) + 1 :].split("/", 1)
        handler = ROUTES.get((self.command, words[0]))
        if handler is None:
            raise Refused(HTTPStatus.NOT_FOUND, f"no {self.command} {route[:100]}", bool(length))
        handler(self, words[1] if len(words) > 1 else "", query, length)

    # ---- routes ------------------------------------------------------------------------------
    def list_(self, rest: str, query: dict, length: int) -> None:
        self.server.keeper.uploads.expire()
        body = json.dumps(self.server.keeper.store.listing().to_json()).encode()
        self._reply(HTTPStatus.OK, body, kind="application/json")

    def get_file(self, rest: str, query: dict, length: int) -> None:
        rel = relative_path(rest)
        found = RANGE.match(self.headers.get("Range") or "")
        version = self.headers.get(VERSION_HEADER) or ""
        if not found or not version:
            raise Refused(HTTPStatus.BAD_REQUEST, "a block needs Range and X-Kubeddp-Version")
        first, last = int(found.group(1)), int(found.group(2))
        fd, size = self.server.keeper.store.open_read(rel, version)
        with open(fd, "rb") as file:
            if first > last or last >= size:
                raise Refused(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, f"{rel} has {size} bytes")
            self.send_response(HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(last - first + 1))
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.end_headers()
            self._send_file(file, first, last - first + 1)

    def _send_file(self, file: io.BufferedReader, offset: int, count: int) -> None:
        idle = self.limits.idle_seconds
        deadline = time.monotonic() + idle + count / self.limits.min_bytes_per_second
        while count:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close_connection = True
                raise TimeoutError("the client read too slowly")
            self.connection.settimeout(min(idle, left))
            sent = self.connection.sendfile(file, offset, min(count, SEND_CHUNK))
            if not sent:
                raise ConnectionError("the file ended early")
            offset, count = offset + sent, count - sent

    def begin(self, rest: str, query: dict, length: int) -> None:
        if rest:  # POST /v2/txn/ID/commit
            self.txn(rest, query, length)
            return
        upload = Upload.from_json(self._json(length))
        txn = self.server.keeper.uploads.begin(upload)
        self._reply(HTTPStatus.CREATED, json.dumps({"txn": txn}).encode(), "application/json")

    def txn(self, rest: str, query: dict, length: int) -> None:
        uploads = self.server.keeper.uploads
        words = rest.split("/")
        if self.command == "DELETE" and len(words) == 1:
            found = uploads.abort(words[0])
            self._reply(HTTPStatus.OK if found else HTTPStatus.NOT_FOUND)
        elif self.command == "POST" and words[1:] == ["commit"] and not length:
            pruned = uploads.commit(words[0])
            self._reply(HTTPStatus.CREATED, json.dumps({"pruned": pruned}).encode())
        elif self.command == "PUT" and len(words) == 3 and all(w.isdigit() for w in words[1:]):
            self._put_block(words[0], int(words[1]), int(words[2]), length)
        else:
            raise Refused(HTTPStatus.NOT_FOUND, f"no {self.command} /v2/txn/{rest[:100]}", True)

    def _put_block(self, txn: str, file_no: int, block_no: int, length: int) -> None:
        uploads = self.server.keeper.uploads
        if self.server.keeper.check is not None:
            staged = uploads.staged.get(txn)
            said = self.headers.get(keeper_auth.BODY_HEADER)
            if staged and 0 <= file_no < len(staged.upload.order):
                blocks = staged.upload.files[staged.upload.order[file_no]].digest.blocks
                if block_no >= len(blocks) or said != blocks[block_no]:
                    raise Refused(HTTPStatus.BAD_REQUEST, "the signed digest is not the block's",
                                  close=True)  # fmt: skip
        self.deadline_socket.deadline = self._body_deadline(length)
        try:
            uploads.put_block(txn, file_no, block_no, self.rfile, length)
        finally:
            self.deadline_socket.deadline = None
        self._reply(HTTPStatus.CREATED)

    def aside(self, rest: str, query: dict, length: int) -> None:
        new = (query.get("as") or [""])[0]
        self.server.keeper.store.aside(relative_path(rest), relative_path(new))
        self._reply(HTTPStatus.CREATED)

    def link(self, rest: str, query: dict, length: int) -> None:
        target = self._json(length).get("target")
        if not isinstance(target, str):
            raise Refused(HTTPStatus.BAD_REQUEST, "a link needs a target")
        store = self.server.keeper.store
        incoming = store.dir_fd([KEEPER_DIR, "incoming"])
        try:
            store.link(relative_path(rest), target, incoming)
        finally:
            os.close(incoming)
        self._reply(HTTPStatus.CREATED)

    def delete(self, rest: str, query: dict, length: int) -> None:
        found = self.server.keeper.store.delete(relative_path(rest))
        self._reply(HTTPStatus.OK if found else HTTPStatus.NOT_FOUND)

    # ---- bodies and replies ------------------------------------------------------------------
    def _body_deadline(self, length: int) -> float:
        return (
            time.monotonic() + self.limits.idle_seconds + length / self.limits.min_bytes_per_second
        )

    def _json(self, length: int) -> dict:
        if length > MAX_JSON_BYTES:
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"{length} bytes of JSON", True)
        self.deadline_socket.deadline = self._body_deadline(length)
        try:
            body = self.rfile.read(length)
        finally:
            self.deadline_socket.deadline = None
        if len(body) != length:
            raise Refused(HTTPStatus.BAD_REQUEST, "the body ended early", close=True)
        said = self.headers.get(keeper_auth.BODY_HEADER)
        if self.server.keeper.check is not None and said != hashlib.sha256(body).hexdigest():
            raise Refused(HTTPStatus.BAD_REQUEST, "the body is not the one signed", close=True)
        data = json.loads(body)
        if not isinstance(data, dict):
            raise Refused(HTTPStatus.BAD_REQUEST, "the body is not a JSON object")
        return data

    def _reply(
        self,
        status: int,
        body: bytes = b"",
        kind: str = "text/plain",
        sign: bool = True,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        check = self.server.keeper.check
        if sign and check is not None:
            digest = hashlib.sha256(body).hexdigest()
            facts = check.facts(self.refusal)
            for name, value in keeper_auth.reply_headers(
                check.secret, self.nonce, status, digest, facts
            ).items():
                self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _refuse(self, status: int, message: str, close: bool) -> None:
        """The one-line reason as the reply (401s and server-side failures in the log too)."""
        if close:
            self.close_connection = True
        if status >= 500 or (status == HTTPStatus.UNAUTHORIZED and self.refusal != "epoch"):
            self.server.log(f"[kubeddp] keeper: {self.command} from {self.client_address[0]} "
                            f"refused ({status}): {message}")  # fmt: skip
        busy = {"Retry-After": "1"} if status == HTTPStatus.SERVICE_UNAVAILABLE else None
        with contextlib.suppress(OSError):
            self._reply(status, f"{message}\n".encode(), extra=busy)


ROUTES = {
    ("GET", "list"): KeeperHandler.list_,
    ("GET", "file"): KeeperHandler.get_file,
    ("DELETE", "file"): KeeperHandler.delete,
    ("POST", "txn"): KeeperHandler.begin,
    ("PUT", "txn"): KeeperHandler.txn,
    ("DELETE", "txn"): KeeperHandler.txn,
    ("POST", "aside"): KeeperHandler.aside,
    ("PUT", "link"): KeeperHandler.link,
}
