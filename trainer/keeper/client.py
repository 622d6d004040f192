"""A pod's client of the checkpoint keeper: signed requests over kept-alive connections, files
moved in parallel as blocks, every block checked against its digest.

A fetched block is hashed as it arrives and written in place; the file counts as fetched only
when every block matched the digest the (signed) listing gave, so a cut connection or a
changed file never passes for the file. A sent block goes with sendfile(2) and is checked by the
keeper on arrival; an upload is committed whole or not at all (keeper/uploads.py). Each way, a
file's blocks go in order on one connection and files go in parallel.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import http.client
import json
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from kubeddp.trainer import constants
from kubeddp.trainer.checkpoint_digest import DigestError
from kubeddp.trainer.fault_points import reached
from kubeddp.trainer.keeper import auth as keeper_auth
from kubeddp.trainer.keeper.blocks import receive_block
from kubeddp.trainer.keeper.protocol import (
    API,
    HEALTH,
    VERSION_HEADER,
    FileEntry,
    Listing,
    Upload,
)

REQUEST_TIMEOUT = 60.0
PARALLEL = 4
REUSE_SECONDS = 20.0  # the keeper closes a connection idle for 60 s: never reuse one near that
TRIES = 3
BUSY_TRIES = 30  # a keeper at its cap of requests in progress answers 503: about a minute


def busy_pause(attempt: int) -> float:
    """Seconds before asking a busy keeper again (Retry-After is 1 s), spread among pods."""
    return min(2.0, 0.25 * (attempt + 1)) * (0.5 + random.random())


# A kept-alive connection the keeper closed meanwhile fails like this before any answer
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class KeeperError(RuntimeError):
    """The keeper cannot be reached or refused a request; the message names it."""


class KeeperRefused(KeeperError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KeeperAuthError(KeeperError):
    """The keeper says this pod's requests are not the job's (401), or its replies are not
    signed with the job's secret: a setting to fix, not a failure to retry."""


class KeeperSettingError(ValueError):
    """The keeper's settings in the environment are wrong (a user's mistake, not retried)."""


class FetchFailed(KeeperError):
    """A file's bytes did not match their digest (or it changed meanwhile) in every try."""


@dataclass(frozen=True)
class Fetch:
    """One file to fetch: where it is on the keeper and what it holds, where it goes here."""

    rel: str
    version: str
    entry: FileEntry
    dest: Path


class KeeperClient:
    def __init__(
        self,
        url: str,
        secret: keeper_auth.Secret | None = None,
        timeout: float = REQUEST_TIMEOUT,
        parallel: int = PARALLEL,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise KeeperSettingError(
                f"{constants.ENV_CHECKPOINT_KEEPER}={url!r} is not http://HOST:PORT; "
                "fix or unset it"
            )
        self.url, self.secret, self.timeout = url, secret, timeout
        self.host, self.port = parts.hostname, parts.port or constants.KEEPER_PORT
        self._idle: queue.LifoQueue[tuple[float, http.client.HTTPConnection]] = queue.LifoQueue()
        self._pool = concurrent.futures.ThreadPoolExecutor(parallel, "kubeddp-keeper")
        self.moved_bytes = 0  # fetched and sent, for the log and the benchmark
        self._count = threading.Lock()

    # ---- connections -------------------------------------------------------------------------
    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """A connection, and whether it was used before (the keeper may have closed it)."""
        while True:
            try:
                since, conn = self._idle.get_nowait()
            except queue.Empty:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                return conn, False
            if time.monotonic() - since < REUSE_SECONDS:
                return conn, True
            conn.close()

    def _done(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if reusable:
            self._idle.put((time.monotonic(), conn))
        else:
            conn.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        while not self._idle.empty():
            self._idle.get_nowait()[1].close()

    def _headers(self, method: str, target: str, body_sha256: str) -> dict[str, str]:
        if self.secret is None:
            return {}
        return keeper_auth.request_headers(self.secret, method, target, body_sha256)

    def _unreachable(self, what: str, exc: BaseException) -> KeeperError:
        return KeeperError(f"keeper {self.url} unreachable ({what}: {exc or type(exc).__name__})")

    # ---- small requests ----------------------------------------------------------------------
    def request(self, method: str, target: str, body: bytes | None = None) -> bytes:
        """One request with a small body; its reply's body (status < 300), else KeeperRefused
        naming the keeper's one line. A keeper busy with other pods (503) is asked again."""
        for attempt in range(BUSY_TRIES):
            try:
                return self._request_once(method, target, body)
            except KeeperRefused as exc:
                if exc.status != 503 or attempt == BUSY_TRIES - 1:
                    raise
                time.sleep(busy_pause(attempt))
        raise AssertionError("unreachable")

    def _request_once(self, method: str, target: str, body: bytes | None) -> bytes:
        digest = hashlib.sha256(body or b"").hexdigest()
        headers = self._headers(method, target, digest)
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            conn, reused = self._connection()
            try:
                conn.request(method, target, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and attempt == 1 and isinstance(exc, STALE):
                    continue  # the keeper had closed the kept-alive connection: a fresh one
                raise self._unreachable(f"{method} {target.split('?')[0]}", exc) from None
        self._done(conn, not answer.will_close)
        if answer.status == 401:
            raise self._refusal(method, target, answer.status, data)
        self._check_reply(headers, answer, data)
        if answer.status >= 300:
            raise self._refusal(method, target, answer.status, data)
        return data

    def _check_reply(self, sent: dict[str, str], answer, data: bytes) -> None:  # noqa: ANN001
        if self.secret is None or answer.status == 503:
            return
        nonce = sent.get(keeper_auth.NONCE_HEADER, "")
        if not keeper_auth.reply_is_signed(self.secret, nonce, answer.status, data, answer.headers):
            raise KeeperAuthError(
                f"the answer from {self.url} is not signed with the job's keeper secret: the "
                "keeper has another secret (or none), or something else answers at that address"
            )

    def _refusal(self, method: str, target: str, status: int, data: bytes) -> KeeperError:
        text = data[:300].decode(errors="replace").strip()
        where = f"{method} {target.split('?')[0]}"
        if status == 401:
            return KeeperAuthError(
                f"the keeper {self.url} refused this pod's request ({text}); the pod's "
                f"{constants.ENV_CHECKPOINT_KEEPER_TOKEN_FILE} must hold the keeper's secret"
            )
        return KeeperRefused(status, f"keeper {self.url}: {where}: {status} {text}")

    def probe(self) -> str | None:
        """None when the keeper answers its health check; else what happened, in a few words."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=min(self.timeout, 5.0))
        try:
            conn.request("GET", HEALTH)
            answer = conn.getresponse()
            body = answer.read(100)
            return None if body == b"ok\n" else f"its health check answered {answer.status}"
        except (OSError, http.client.HTTPException) as exc:
            return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        finally:
            conn.close()

    def healthy(self) -> bool:
        return self.probe() is None

    def listing(self) -> Listing:
        try:
            return Listing.from_json(json.loads(self.request("GET", f"{API}/list")))
        except (ValueError, DigestError) as exc:
            raise KeeperError(f"keeper {self.url}: its listing is not one ({exc})") from None

    def delete(self, rel: str) -> bool:
        try:
            self.request("DELETE", f"{API}/file/{quote(rel)}")
            return True
        except KeeperRefused as exc:
            if exc.status == 404:
                return False
            raise

    def aside(self, name: str, new: str) -> bool:
        try:
            self.request("POST", f"{API}/aside/{quote(name)}?as={quote(new)}", b"")
            return True
        except KeeperRefused as exc:
            if exc.status in (404, 409):  # gone already (pruned), or moved by an earlier try
                return False
            raise

    def link(self, rel: str, target: str) -> None:
        self.request("PUT", f"{API}/link/{quote(rel)}", json.dumps({"target": target}).encode())

    # ---- many blocks at once -----------------------------------------------------------------
    def _in_parallel(self, tasks: Iterable[Callable[[], None]]) -> None:
        """Run every task on the pool; the first failure cancels what has not started and a
        failure is raised once the running ones are done: the cause, not its echo (a keeper that
        refuses one block (507, a full disk) drops the upload, and the blocks still in flight
        then hear 404 for it)."""
        futures = [self._pool.submit(task) for task in tasks]
        _, pending = concurrent.futures.wait(futures, return_when="FIRST_EXCEPTION")
        for future in pending:
            future.cancel()
        concurrent.futures.wait(pending)
        failures = [f.exception() for f in futures if not f.cancelled() and f.exception()]
        if failures:
            raise next((e for e in failures if getattr(e, "status", None) != 404), failures[0])

    def _count_bytes(self, count: int) -> None:
        with self._count:
            self.moved_bytes += count

    # ---- fetching ----------------------------------------------------------------------------
    def fetch(self, files: list[Fetch]) -> None:
        """Every file, whole and checked, at its `dest` (made here), with its time."""
        fds = {}
        try:
            for item in files:
                item.dest.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(item.dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                fds[item.dest] = fd
                os.ftruncate(fd, item.entry.digest.size)
            self._in_parallel(
                (lambda i=item: self._fetch_file(i, fds[i.dest]))
                for item in files
                if item.entry.digest.size
            )
            for item in files:
                if item.entry.mtime_ns:
                    os.utime(fds[item.dest], ns=(item.entry.mtime_ns, item.entry.mtime_ns))
        finally:
            for fd in fds.values():
                os.close(fd)

    def _fetch_file(self, item: Fetch, fd: int) -> None:
        """A file's blocks in order, on one connection; files in parallel. Several threads
        writing one new file contend in the kernel for its lock and page cache (measured on a
        2-core VM: a 1 GiB push cost the keeper 0.85-1.0 CPU-s/GiB with 4 streams into the
        file and 0.7-0.8 with one; docs/checkpoints.md has the fetch's figures)."""
        for block in range(len(item.entry.digest.blocks)):
            self._fetch_block(item, block, fd)

    def _fetch_block(self, item: Fetch, block: int, fd: int) -> None:
        for attempt in range(TRIES):
            try:
                return self._get_block(item, block, fd)
            except KeeperRefused as exc:
                if exc.status == 503 and attempt < TRIES - 1:
                    time.sleep(busy_pause(attempt))
                    continue
                if exc.status != 409:
                    raise
                raise FetchFailed(f"{exc}") from None  # replaced since the listing: list again
            except (FetchFailed, KeeperAuthError):
                if attempt == TRIES - 1:
                    raise
            except KeeperError:  # a cut connection: this block again, on a new one
                if attempt == TRIES - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def _get_block(self, item: Fetch, block: int, fd: int) -> None:
        offset, size = item.entry.digest.span(block)
        target = f"{API}/file/{quote(item.rel)}"
        headers = self._headers("GET", target, keeper_auth.EMPTY_SHA256)
        headers |= {"Range": f"bytes={offset}-{offset + size - 1}", VERSION_HEADER: item.version}
        conn, _ = self._connection()
        try:
            conn.request("GET", target, headers=headers)
            answer = conn.getresponse()
            if answer.status != 206:
                data = answer.read()
                self._done(conn, not answer.will_close)
                if answer.status != 401:
                    self._check_reply(headers, answer, data)
                raise self._refusal("GET", target, answer.status, data)
            got = receive_block(answer.readinto, fd, offset, size, item.entry.digest.algorithm)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._unreachable(f"GET {item.rel}", exc) from None
        self._done(conn, not answer.will_close)
        self._count_bytes(size)
        if got != item.entry.digest.blocks[block]:
            raise FetchFailed(f"{item.rel}: block {block} from {self.url} differs from its digest")

    # ---- sending -----------------------------------------------------------------------------
    def upload(self, upload: Upload, sources: dict[str, Path]) -> list[str]:
        """Send `upload` (its files from `sources`) and commit it; what the keeper pruned.
        A keeper that restarted meanwhile forgot the upload: it is begun again."""
        for attempt in range(TRIES):
            begun = json.loads(self.request("POST", f"{API}/txn",
                                            json.dumps(upload.to_json()).encode()))  # fmt: skip
            txn = str(begun["txn"])
            reached("send-begun")
            try:
                self._send_blocks(txn, upload, sources)
                answer = self.request("POST", f"{API}/txn/{txn}/commit", b"")
            except KeeperRefused as exc:
                if exc.status == 404 and attempt < TRIES - 1:
                    continue  # the keeper restarted and forgot the upload
                self._abort(txn)
                raise
            except BaseException:
                self._abort(txn)
                raise
            reached("send-committed")
            return list(json.loads(answer).get("pruned", []))
        raise KeeperError(f"keeper {self.url} lost the upload of {upload.name} {TRIES} times")

    def _abort(self, txn: str) -> None:
        with contextlib.suppress(KeeperError):
            self.request("DELETE", f"{API}/txn/{txn}")

    def _send_blocks(self, txn: str, upload: Upload, sources: dict[str, Path]) -> None:
        """A file's blocks in order, on one connection; files in parallel (as a fetch)."""

        def send_file(file_no: int, rel: str) -> None:
            entry = upload.files[rel]
            for block in range(len(entry.digest.blocks)):
                self._send_block(txn, file_no, entry, block, sources[rel])

        self._in_parallel(
            (lambda n=file_no, r=rel: send_file(n, r)) for file_no, rel in enumerate(upload.order)
        )

    def _send_block(
        self, txn: str, file_no: int, entry: FileEntry, block: int, source: Path
    ) -> None:
        for attempt in range(TRIES):
            try:
                self._put_block(txn, file_no, entry, block, source)
                reached("send-block")
                return
            except KeeperRefused as exc:
                if exc.status not in (409, 422, 503) or attempt == TRIES - 1:
                    raise
            except KeeperAuthError:
                raise
            except KeeperError:  # a cut connection: this block again, on a new one
                if attempt == TRIES - 1:
                    raise
            time.sleep(0.5 * (attempt + 1))

    def _put_block(
        self, txn: str, file_no: int, entry: FileEntry, block: int, source: Path
    ) -> None:
        offset, size = entry.digest.span(block)
        target = f"{API}/txn/{txn}/{file_no}/{block}"
        headers = self._headers("PUT", target, entry.digest.blocks[block])
        conn, _ = self._connection()
        try:
            conn.putrequest("PUT", target, skip_accept_encoding=True)
            for name, value in {**headers, "Content-Length": str(size)}.items():
                conn.putheader(name, value)
            conn.endheaders()
            if size:
                with open(source, "rb") as file:
                    if conn.sock is None or conn.sock.sendfile(file, offset, size) != size:
                        raise ConnectionError(f"{source} ended before its block {block}")
            answer = conn.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._unreachable(f"sending {source.name}", exc) from None
        self._done(conn, not answer.will_close)
        if answer.status != 401:
            self._check_reply(headers, answer, data)
        if answer.status >= 300:
            raise self._refusal("PUT", target, answer.status, data)
        self._count_bytes(size)
