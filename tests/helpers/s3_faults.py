"""An endpoint that is not quite S3, as its own process on 127.0.0.1, for the checkpoint tests:

python -m tests.helpers.s3_faults html PORT              # 200 and an HTML page, always
python -m tests.helpers.s3_faults json PORT              # 200 and a JSON object, always
python -m tests.helpers.s3_faults text PORT              # 200 and a line of text, always
python -m tests.helpers.s3_faults redirect PORT CODE     # CODE (301, 307) to another path
python -m tests.helpers.s3_faults throttle PORT N UPSTREAM
    # 503 SlowDown to the first N requests (N < 0: to all), then each request passed on to
    # the real S3 server at UPSTREAM (moto's)
python -m tests.helpers.s3_faults short PORT UPSTREAM    # passes every request on, but an
    # upload into a checkpoint (a key with /ckpt-) arrives with half its body: the server
    # stores part of it and answers 200 (the client must send plain bodies:
    # AWS_REQUEST_CHECKSUM_CALCULATION=when_required)
python -m tests.helpers.s3_faults flip PORT UPSTREAM     # as short, one byte changed instead
python -m tests.helpers.s3_faults drip PORT UPSTREAM     # passes on; a GET of a checkpoint's
    # object is answered a byte every 0.2 s
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

HTML = b"<!DOCTYPE html><html><head><title>Console</title></head><body>Sign in</body></html>\n"
SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please '
    b"reduce your request rate.</Message><RequestId>k</RequestId></Error>"
)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "html"
    throttle_left = 0
    upstream = ""
    lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                data += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return data
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(
        self, status: int, body: bytes, kind: str, extra: dict | None = None, length: int = 0
    ) -> None:
        """`length`: a HEAD's Content-Length (the object's size, as the server said it)."""
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else length))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _serve(self) -> None:
        body = self._body()
        if self.mode == "html":
            self._answer(200, HTML, "text/html")
            return
        if self.mode == "json":
            self._answer(200, b'{"ok": true, "items": []}', "application/json")
            return
        if self.mode == "text":
            self._answer(200, b"OK\n", "text/plain; charset=utf-8")
            return
        if self.mode == "redirect":
            where = f"http://{self.headers.get('Host')}/moved{self.path}"
            self._answer(int(self.upstream), b"", "application/xml", {"Location": where})
            return
        into_checkpoint = "/ckpt-" in self.path and self.command == "PUT" and body
        if self.mode == "short" and into_checkpoint:
            body = body[: len(body) // 2]
        elif self.mode == "flip" and into_checkpoint:
            middle = len(body) // 2
            body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1 :]
        if self.mode in ("short", "flip", "drip"):
            self._pass_on(body, drip=self.mode == "drip" and "/ckpt-" in self.path)
            return
        with self.lock:
            throttled = Handler.throttle_left != 0
            if Handler.throttle_left > 0:
                Handler.throttle_left -= 1
        if throttled:
            self._answer(503, SLOW_DOWN, "application/xml")
            return
        self._pass_on(body)

    def _pass_on(self, body: bytes, drip: bool = False) -> None:
        parts = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
        headers["Content-Length"] = str(len(body))
        conn.request(self.command, self.path, body=body, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
        skip = {"content-length", "transfer-encoding", "connection"}
        extra = {k: v for k, v in answer.getheaders() if k.lower() not in skip | {"content-type"}}
        if drip and self.command == "GET":
            self.send_response(answer.status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for at in range(len(data)):
                self.wfile.write(data[at : at + 1])
                self.wfile.flush()
                time.sleep(0.2)
        else:
            kind = answer.getheader("Content-Type") or ""
            length = int(answer.getheader("Content-Length") or 0)
            self._answer(answer.status, data, kind, extra, length)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve  # noqa: N815


def main(argv: list[str]) -> int:
    Handler.mode = argv[0]
    if Handler.mode == "throttle":
        Handler.throttle_left, Handler.upstream = int(argv[2]), argv[3]
    elif len(argv) > 2:  # redirect: its code; short, flip, drip: the server behind
        Handler.upstream = argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", int(argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


@contextlib.contextmanager
def started(log_dir: Path, mode: str, *args: str) -> Iterator[str]:
    """This endpoint as a process on a free port (killed after the block); its URL."""
    from tests.helpers import procs
    from tests.helpers.ports import free_port

    port = free_port()
    argv = [sys.executable, "-m", "tests.helpers.s3_faults", mode, str(port), *args]
    with procs.started(argv, log_dir / f"s3-{mode}-{port}.log") as proc:

        def answers() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        procs.wait_until(answers, 60, f"the {mode} endpoint", proc)
        yield f"http://127.0.0.1:{port}"
