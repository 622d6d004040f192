"""A stand-in Kubernetes API server for the cluster commands: a real HTTP server on 127.0.0.1 in
a thread of the test process. Routes map (method, path) to (status, body); every request is
recorded; a route's body may be a `Streamed` answer (a followed log). `misbehave` makes every
answer go wrong the ways a broken cluster, a proxy or a wrong URL do: hang, HTML, a 500 page,
a reset connection, JSON that is not an object.
With `admission` set (tests/helpers/admission.py), the POSTs of Trainer's kinds go through it:
Trainer v2.3's TrainJob webhook, with its informer cache's lag.
With `tls_folder` it serves HTTPS with a certificate for 127.0.0.1 made for the test (kubectl
sends a kubeconfig's bearer token only over TLS).
It answers API discovery as a real API server does: GET /apis lists the groups and versions of
what it serves (APIGroupList), GET /apis/<group>/<version> that version's resources
(APIResourceList), a version it does not serve is a plain 404; `serve(resource)` adds an
operator's API (the built-in groups kubeddp uses are served from the start)."""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import queue
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import yaml

from kubeddp.tools.manifests.resources import Resource
from tests.helpers import admission

TOKEN = "contract-test-token"
NAMESPACE = "team"
HTML = b"<html><head><title>Sign in</title></head><body>proxy login</body></html>"
MISBEHAVIOURS = (
    "hang",  # accept, read the request, never answer
    "hang-body",  # send the headers, then nothing
    "html",  # 200 text/html (a login page, a wrong URL)
    "500",  # 500 with an HTML error page
    "502",  # 502 Bad Gateway from a proxy, plain text
    "reset",  # close the connection with a TCP RST before answering
    "close",  # close the connection cleanly before answering
    "json-list",  # 200 with a JSON list instead of an object
    "json-bad",  # 200 application/json that is not JSON
    "truncated",  # Content-Length 1000, 10 bytes, close
    "garbage",  # not HTTP at all
    "empty-object",  # 200 `{}` to everything: JSON, an object, but no Kubernetes object
    "wrong-kind",  # 200 with a Pod, whatever was asked for
    "deep",  # 200 with an object nested 100,000 deep
    "drip",  # the answer a byte at a time, each soon enough for a per-read timeout
)
A_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "status": {"phase": "Running"},
}
DRIP_SECONDS = 0.3  # between two bytes of a "drip" answer


# What every cluster serves that kubeddp uses (k8s.io/api v0.36 group versions and plurals).
BUILT_IN = (
    Resource("Job", "batch", "v1", "jobs"),
    Resource("Deployment", "apps", "v1", "deployments"),
    Resource("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies"),
    Resource("StorageClass", "storage.k8s.io", "v1", "storageclasses"),
    Resource("CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions"),
)


def discovery_answer(path: str, served: list[Resource]) -> dict | None:
    """What the API server answers to a discovery GET of `path`; None: not a discovery path
    it serves."""
    versions: dict[str, list[Resource]] = {}
    for resource in served:
        versions.setdefault(resource.api_version, []).append(resource)
    if path == "/apis":
        groups: dict[str, list[str]] = {}
        for api_version in versions:
            group, version = api_version.split("/")
            groups.setdefault(group, []).append(version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{group}/{vs[0]}", "version": vs[0]},
                }
                for group, vs in groups.items()
            ],
        }
    api_version = path.removeprefix("/apis/")
    if not path.startswith("/apis/") or api_version not in versions:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": api_version,
        "resources": [
            {"name": r.plural, "singularName": r.kind.lower(), "namespaced": True, "kind": r.kind}
            for r in versions[api_version]
        ],
    }


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


class Streamed:
    """An answer written as it comes, like a followed pod log: what `put()` gets goes out at
    once; `end()` ends the answer (the container ended). `ended` is set once the server has
    stopped writing it (ended, or the reader closed the connection)."""

    def __init__(self, first: str = "") -> None:
        self.chunks: queue.Queue[bytes | None] = queue.Queue()
        self.ended = threading.Event()
        if first:
            self.put(first)

    def put(self, text: str | bytes) -> None:
        self.chunks.put(text.encode() if isinstance(text, str) else text)

    def end(self) -> None:
        self.chunks.put(None)


class FakeApiServer:
    """Routes (method, path) -> (status, body); records every request."""

    def __init__(self, tls_folder: Path | None = None) -> None:
        self.routes: dict[tuple[str, str], tuple[int, object]] = {}
        self.requests: list[dict] = []
        self.misbehaviour: str | None = None
        # Trainer's objects, through its TrainJob webhook, when a test sets it
        self.admission: admission.ApiObjects | None = None
        self.release = threading.Event()  # ends the hanging answers (at shutdown)
        self.served: list[Resource] = list(BUILT_IN)  # API discovery lists these
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body_sent = json.loads(raw) if raw else None
                except ValueError:
                    body_sent = raw
                fake.requests.append(
                    {
                        "method": self.command,
                        "path": url.path,
                        "raw_path": self.path,
                        "query": dict(parse_qsl(url.query)),
                        "body": body_sent,
                        "authorization": self.headers.get("Authorization"),
                    }
                )
                if fake.misbehaviour:
                    self._misbehave(fake.misbehaviour)
                    return
                if fake.admission is not None and self._admitted(url, body_sent):
                    return
                discovery = self.command == "GET" and discovery_answer(url.path, fake.served)
                status, body = fake.routes.get(
                    (self.command, url.path),
                    (200, discovery) if discovery else (404, "404 page not found"),
                )
                if body is None:  # what the API server answers when a test did not say
                    body = self._usual_answer(body_sent)
                if callable(body):
                    body = body()
                if isinstance(body, Streamed):
                    self._stream(status, body)
                    return
                if isinstance(body, (dict, list)):
                    data, ctype = json.dumps(body).encode(), "application/json"
                elif isinstance(body, bytes):  # as they are (a log's raw bytes)
                    data, ctype = body, "text/plain"
                else:
                    data, ctype = str(body).encode(), "text/plain"
                self._answer(status, ctype, data)

            def _admitted(self, url, body_sent: object) -> bool:
                """A POST of a kind `admission` holds goes through it (Trainer's webhook)."""
                if self.command != "POST" or not isinstance(body_sent, dict):
                    return False
                if body_sent.get("kind") not in admission.TRAINER_KINDS:
                    return False
                dry_run = dict(parse_qsl(url.query)).get("dryRun") == "All"
                try:
                    answer, status = fake.admission.create(body_sent, dry_run), 201
                except admission.Refused as refused:
                    answer = status_body(refused.code, refused.reason, refused.message)
                    status = refused.code
                self._answer(status, "application/json", json.dumps(answer).encode())
                return True

            def _usual_answer(self, body_sent: object) -> object:
                """POST: the object as created; DELETE: a Status of Success; GET: {}."""
                if self.command == "POST" and isinstance(body_sent, dict):
                    return body_sent
                if self.command == "DELETE":
                    return {"kind": "Status", "apiVersion": "v1", "status": "Success"}
                return {}

            def _answer(self, status: int, ctype: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, status: int, body: Streamed) -> None:
                """Each chunk as it is put, until end() (no length: the close ends it)."""
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.flush()
                while not fake.release.is_set():
                    try:
                        chunk = body.chunks.get(timeout=0.05)
                    except queue.Empty:
                        if self._reader_gone():
                            break
                        continue
                    if chunk is None:
                        break
                    try:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    except OSError:  # the reader went away (kubeddp closed the stream)
                        break
                body.ended.set()
                self.close_connection = True

            def _reader_gone(self) -> bool:
                """The client closed the connection (it sends nothing more after a GET)."""
                if not select.select([self.connection], [], [], 0)[0]:
                    return False
                try:
                    return self.connection.recv(1) == b""
                except (OSError, ValueError):
                    return True

            def _misbehave(self, mode: str) -> None:
                if mode == "hang":
                    fake.release.wait(120)
                elif mode == "hang-body":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.flush()
                    fake.release.wait(120)
                elif mode == "html":
                    self._answer(200, "text/html", HTML)
                elif mode == "500":
                    self._answer(500, "text/html", b"<html><h1>500 Internal Server Error</h1>")
                elif mode == "502":
                    self._answer(502, "text/plain", b"Bad Gateway")
                elif mode == "reset":
                    linger = struct.pack("ii", 1, 0)  # close() sends RST
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    self.connection.close()
                elif mode == "close":
                    self.connection.close()
                elif mode == "json-list":
                    self._answer(200, "application/json", b"[1, 2, 3]")
                elif mode == "json-bad":
                    self._answer(200, "application/json", b"{not json")
                elif mode == "truncated":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b'{"kind": "')
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif mode == "empty-object":
                    self._answer(200, "application/json", b"{}")
                elif mode == "wrong-kind":
                    self._answer(200, "application/json", json.dumps(A_POD).encode())
                elif mode == "deep":
                    deep = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
                    self._answer(200, "application/json", deep)
                elif mode == "drip":
                    data = json.dumps(A_POD).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    for byte in data:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        if fake.release.wait(DRIP_SECONDS):
                            break
                elif mode == "garbage":
                    self.wfile.write(b"\x00\xffnot http at all\r\n\r\n")
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                else:
                    raise ValueError(f"unknown misbehaviour {mode!r}")
                self.close_connection = True

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.ca_pem: bytes | None = None
        scheme = "http"
        if tls_folder is not None:
            cert, key = self_signed_cert(tls_folder)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.ca_pem, scheme = cert.read_bytes(), "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def serve(self, *resources: Resource) -> None:
        """Serve these APIs too (an operator installed): discovery lists them."""
        self.served += resources

    def route(self, method: str, path: str, status: int = 200, body: object = None) -> None:
        self.routes[(method, path)] = (status, body)  # None: the usual answer (_usual_answer)

    def calls(self, method: str | None = None) -> list[dict]:
        return [r for r in self.requests if method is None or r["method"] == method]

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made now (cryptography comes with moto)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-api")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "fake-api.crt", folder / "fake-api.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def kubeconfig_for(
    url: str, token: str = TOKEN, namespace: str = NAMESPACE, ca_pem: bytes | None = None
) -> dict:
    cluster: dict[str, str] = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [
            {"name": "test", "context": {"cluster": "c", "user": "u", "namespace": namespace}}
        ],
    }


def write_kubeconfig(path: Path, url: str, ca_pem: bytes | None = None) -> Path:
    path.write_text(yaml.safe_dump(kubeconfig_for(url, ca_pem=ca_pem)))
    return path


@contextlib.contextmanager
def running(tls_folder: Path | None = None) -> Iterator[FakeApiServer]:
    server = FakeApiServer(tls_folder)
    server.thread.start()
    try:
        yield server
    finally:
        server.stop()


def wait_for_requests(server: FakeApiServer, count: int, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while len(server.requests) < count and time.monotonic() < end:
        time.sleep(0.01)
