"""An endpoint that is not quite S3, as its own process on 127.0.0.1, for the checkpoint tests:

python -m tests.helpers.s3_faults html PORT              # 200 and an HTML page, always
python -m tests.helpers.s3_faults throttle PORT N UPSTREAM
    # 503 SlowDown to the first N requests (N < 0: to all), then each request passed on to
    # the real S3 server at UPSTREAM (moto's)
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import sys
import threading
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

    def _answer(self, status: int, body: bytes, kind: str, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else 0))
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
        with self.lock:
            throttled = Handler.throttle_left != 0
            if Handler.throttle_left > 0:
                Handler.throttle_left -= 1
        if throttled:
            self._answer(503, SLOW_DOWN, "application/xml")
            return
        self._pass_on(body)

    def _pass_on(self, body: bytes) -> None:
        parts = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
        headers["Content-Length"] = str(len(body))
        conn.request(self.command, self.path, body=body, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
        skip = {"content-length", "transfer-encoding", "connection"}
        extra = {k: v for k, v in answer.getheaders() if k.lower() not in skip | {"content-type"}}
        self._answer(answer.status, data, answer.getheader("Content-Type") or "", extra)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve  # noqa: N815


def main(argv: list[str]) -> int:
    Handler.mode = argv[0]
    if Handler.mode == "throttle":
        Handler.throttle_left, Handler.upstream = int(argv[2]), argv[3]
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
    from tests.helpers.s3server import free_port

    port = free_port()
    argv = [sys.executable, "-m", "tests.helpers.s3_faults", mode, str(port), *args]
    with procs.started(argv, log_dir / f"s3-{mode}-{port}.log") as proc:

        def answers() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        procs.wait_until(answers, 60, f"the {mode} endpoint", proc)
        yield f"http://127.0.0.1:{port}"
