"""`kubeddp keeper`: the one pod that mounts the checkpoint claim and serves its files over HTTP.

Why: the default StorageClass of EKS, GKE, AKS and kind is ReadWriteOnce, so a claim can be
mounted on one node only. The keeper holds it; every training pod keeps checkpoint.dir on an
emptyDir, fills it from the keeper before its workers start and sends back what rank 0 writes
(trainer/launcher/checkpoint_sync.py). No training pod needs the volume, so they schedule on any
node, and a lost node-rank-0 pod loses nothing the keeper already has.

Every write is atomic on the claim: a file is written under `.incoming/`, flushed and renamed
into place; a checkpoint directory is staged file by file and renamed into place by one commit.
A reader therefore sees the old file or directory or the new one, never a part. Names starting
with `.` are the keeper's own and are neither listed nor accepted.

    GET    /healthz                      ok
    GET    /v1/list                      {"files": [{"path", "size", "mtime_ns"}...]}
    GET    /v1/file/PATH                 the file's bytes
    PUT    /v1/file/PATH                 replace one file (body = content)
    PUT    /v1/stage/TXN/PATH            stage a file of a directory commit
    POST   /v1/commit/TXN/NAME           rename the staged directory NAME into place
    DELETE /v1/file/PATH                 remove a file or a top-level directory
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from kubeddp.trainer import constants, exit_codes
from kubeddp.trainer.arguments import OneLineErrorParser

INCOMING = ".incoming"
ABANDONED_SECONDS = 3600.0
CHUNK = 1 << 20
TXN_CHARS = set("0123456789abcdef")


class BadPath(ValueError):
    pass


def relative_path(text: str) -> str:
    """A path inside the keeper's directory: no `..`, no absolute path, no hidden part."""
    parts = unquote(text).split("/")
    if not parts or any(not p or p in (".", "..") or p.startswith(".") or "\0" in p for p in parts):
        raise BadPath(f"{text!r} is not a plain relative path")
    return "/".join(parts)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_files(root: Path) -> list[dict]:
    """Every file under `root` except the keeper's hidden ones, sorted by path."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed while listing
                continue
            found.append(
                {
                    "path": path.relative_to(root).as_posix(),
                    "size": stat.st_size,
                    "mtime_ns": stat.st_mtime_ns,
                }
            )
    return found


class Keeper:
    """The directory the keeper serves, and its atomic operations."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.incoming = root / INCOMING
        self.lock = threading.Lock()  # commits and deletes of top-level names, one at a time

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.incoming, ignore_errors=True)  # uploads a dead keeper left half done
        self.incoming.mkdir()

    def _receive(self, target: Path, reader, length: int) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            left = length
            while left > 0:
                chunk = reader.read(min(CHUNK, left))
                if not chunk:
                    raise ConnectionError(f"upload ended {left} bytes early")
                out.write(chunk)
                left -= len(chunk)
            out.flush()
            os.fsync(out.fileno())

    def put_file(self, rel: str, reader, length: int) -> None:
        temp = self.incoming / f"file-{uuid.uuid4().hex}"
        try:
            self._receive(temp, reader, length)
            final = self.root / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.is_dir():
                raise BadPath(f"{rel} is a directory")
            os.replace(temp, final)
            _fsync_dir(final.parent)
        finally:
            temp.unlink(missing_ok=True)

    def stage(self, txn: str, rel: str, reader, length: int) -> None:
        self._receive(self.incoming / txn / rel, reader, length)

    def commit(self, txn: str, name: str) -> None:
        staged = self.incoming / txn / name
        if not staged.is_dir():
            raise BadPath(f"nothing staged for {name} in {txn}")
        final = self.root / name
        with self.lock:
            if final.exists():  # the same step saved again: the new one wins, atomically
                aside = self.incoming / f"old-{uuid.uuid4().hex}"
                os.replace(final, aside)
                os.replace(staged, final)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.replace(staged, final)
            _fsync_dir(self.root)
        shutil.rmtree(self.incoming / txn, ignore_errors=True)
        self._drop_abandoned()

    def _drop_abandoned(self) -> None:
        """Uploads a lost pod left half done (untouched for an hour) take no space for long."""
        cutoff = time.time() - ABANDONED_SECONDS
        for entry in self.incoming.iterdir():
            try:
                if entry.stat().st_mtime >= cutoff:
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            except FileNotFoundError:
                continue

    def delete(self, rel: str) -> bool:
        target = self.root / rel
        with self.lock:
            if target.is_dir():
                aside = self.incoming / f"old-{uuid.uuid4().hex}"
                os.replace(target, aside)  # gone at once for readers; removed after
                shutil.rmtree(aside, ignore_errors=True)
                return True
            if target.exists():
                target.unlink()
                return True
        return False


class _Handler(BaseHTTPRequestHandler):
    keeper: Keeper
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per request would flood the pod's log

    def _reply(self, status: int, body: bytes = b"", kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _route(self, prefix: str) -> str | None:
        return self.path[len(prefix) :] if self.path.startswith(prefix) else None

    def _fail(self, exc: Exception) -> None:
        status = HTTPStatus.BAD_REQUEST if isinstance(exc, BadPath) else HTTPStatus.NOT_FOUND
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            status = HTTPStatus.INSUFFICIENT_STORAGE  # disk full, read-only, permission
        self._reply(status, f"{exc}\n".encode())

    def do_GET(self) -> None:  # noqa: N802
        try:
            if self.path == "/healthz":
                self._reply(HTTPStatus.OK, b"ok\n")
            elif self.path == "/v1/list":
                body = json.dumps({"files": list_files(self.keeper.root)}).encode()
                self._reply(HTTPStatus.OK, body, "application/json")
            elif (rest := self._route("/v1/file/")) is not None:
                path = self.keeper.root / relative_path(rest)
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    self.send_response(HTTPStatus.OK)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    shutil.copyfileobj(f, self.wfile, CHUNK)
            else:
                self._reply(HTTPStatus.NOT_FOUND, b"unknown path\n")
        except (BadPath, OSError) as exc:
            self._fail(exc)

    def _length(self) -> int:
        return int(self.headers.get("Content-Length", "0"))

    def do_PUT(self) -> None:  # noqa: N802
        length = self._length()
        try:
            if (rest := self._route("/v1/file/")) is not None:
                self.keeper.put_file(relative_path(rest), self.rfile, length)
            elif (rest := self._route("/v1/stage/")) is not None:
                txn, _, rel = rest.partition("/")
                if not txn or not set(txn) <= TXN_CHARS:
                    raise BadPath(f"transaction {txn!r} is not hex")
                self.keeper.stage(txn, relative_path(rel), self.rfile, length)
            else:
                raise BadPath(f"unknown path {self.path}")
            self._reply(HTTPStatus.CREATED)
        except (BadPath, OSError) as exc:
            self.close_connection = True  # the body may be left unread
            self._fail(exc)

    def do_POST(self) -> None:  # noqa: N802
        try:
            rest = self._route("/v1/commit/")
            if rest is None:
                raise BadPath(f"unknown path {self.path}")
            txn, _, name = rest.partition("/")
            if not txn or not set(txn) <= TXN_CHARS or "/" in relative_path(name):
                raise BadPath(f"commit {rest!r} is not TXN/NAME")
            self.keeper.commit(txn, relative_path(name))
            self._reply(HTTPStatus.CREATED)
        except (BadPath, OSError) as exc:
            self._fail(exc)

    def do_DELETE(self) -> None:  # noqa: N802
        try:
            rest = self._route("/v1/file/")
            if rest is None:
                raise BadPath(f"unknown path {self.path}")
            found = self.keeper.delete(relative_path(rest))
            self._reply(HTTPStatus.OK if found else HTTPStatus.NOT_FOUND)
        except (BadPath, OSError) as exc:
            self._fail(exc)


def serve(root: Path, host: str, port: int) -> ThreadingHTTPServer:
    keeper = Keeper(root)
    keeper.prepare()
    handler = type("KeeperHandler", (_Handler,), {"keeper": keeper})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def keeper_main(argv: list[str]) -> int:
    p = OneLineErrorParser(
        prog="kubeddp keeper",
        description="serve a checkpoint directory (the claim mounted in this pod) to the "
        "training pods of a job",
    )
    p.add_argument("--dir", default=constants.CHECKPOINT_DIR, help="the directory to serve")
    p.add_argument("--port", type=int, default=constants.KEEPER_PORT)
    p.add_argument("--bind", default="0.0.0.0", help="address to listen on")
    args = p.parse_args(argv)
    root = Path(args.dir)
    try:
        server = serve(root, args.bind, args.port)
    except OSError as exc:
        why = exc.strerror or exc
        print(
            f"kubeddp keeper: error: cannot serve {root} on port {args.port} ({why}); check "
            "that the claim is mounted there and writable by this user",
            file=sys.stderr,
        )
        return exit_codes.BAD_INPUT
    print(f"[kubeddp] keeper: serving {root} on port {args.port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return keeper_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
