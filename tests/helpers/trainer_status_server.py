"""A stand-in for Kubeflow Trainer's TrainJob status server, checking each request as the real
one does (kubeflow/trainer v2.3.0, the same since v2.2.0):

- pkg/statusserver/server.go: only `POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/
  trainjobs/{name}/status` (else 404), a body of at most 64 KiB, JSON `{"trainerStatus": ...}`
  (else 422 "Invalid payload"); an unknown TrainJob is 404; 200 echoes the request.
- pkg/statusserver/auth.go: `Authorization: Bearer <token>` (scheme in any case, one
  credential), an OIDC-verified token (signature, expiry) whose audience is
  `trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status` and whose
  `kubernetes.io.namespace` claim is the TrainJob's namespace; else 403 "Forbidden".
- the API server's validation of the status it applies: the TrainJob CRD's
  `status.trainerStatus` schema (tests/reference/crds, v2.3.0) with jsonschema, its CEL rule
  (lastUpdatedTime is required) and int32 ranges, else 422. Stricter than Trainer in one way on
  purpose: an unknown field is refused, as Trainer would drop it silently (Go's decoder).

Tokens here are ES256 JWTs signed by the test's issuer key (the cluster's service-account
issuer); TLS uses a CA and a server certificate made for the test.
"""

from __future__ import annotations

import base64
import copy
import datetime
import functools
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.helpers.reference import CRDS, read_text

TRAINJOB_CRD = CRDS / "trainer.kubeflow.org_trainjobs.v2.3.0.yaml"
PATH = re.compile(
    r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)/status$"
)
MAX_BODY = 1 << 16  # server.go maxBodySize
INT32_MAX = 2**31 - 1
# trainjobstatus.go: the env names, and the projected volume's mount path and file names
ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
MOUNT_PATH = "/var/run/secrets/kubeflow/trainer"


def status_path(namespace: str, name: str) -> str:
    """utils.go StatusUrl."""
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def token_audience(namespace: str, name: str) -> str:
    """utils.go TokenAudience."""
    return f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


# ---------------------------------------------------------------- the CRD's schema
@functools.cache
def trainer_status_schema() -> dict[str, Any]:
    """status.trainerStatus of the v2.3.0 TrainJob CRD, every object closed to unknown fields
    (read once: the CRD is 6,000 lines of YAML; callers do not change it)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(read_text(TRAINJOB_CRD), Loader=loader)  # a safe loader, in C where built
    (version,) = crd["spec"]["versions"]
    schema = copy.deepcopy(
        version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["trainerStatus"]
    )

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


def status_problems(status: Any, schema: dict[str, Any]) -> list[str]:
    """Why the API server would refuse `status` as status.trainerStatus ([] when it would not)."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in
                validator.iter_errors(status)]  # fmt: skip
    if isinstance(status, dict):
        if "lastUpdatedTime" not in status:  # the CEL rule x-kubernetes-validations
            problems.append("lastUpdatedTime is required when trainerStatus is present")
        for key in ("progressPercentage", "estimatedRemainingSeconds"):  # format: int32
            value = status.get(key)
            if isinstance(value, int) and not -(2**31) <= value <= INT32_MAX:
                problems.append(f"{key}: {value} is not an int32")
    return problems


# ---------------------------------------------------------------- TLS and tokens
@dataclass
class Credentials:
    """A CA and the server's certificate (for `hosts`), and the service-account issuer's key."""

    folder: Path
    hosts: tuple[str, ...]
    ca_file: Path = field(init=False)
    cert_file: Path = field(init=False)
    key_file: Path = field(init=False)
    issuer_key: Any = field(init=False)

    def __post_init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca_file, self.cert_file, self.key_file = _make_tls(self.folder, self.hosts)
        self.issuer_key = ec.generate_private_key(ec.SECP256R1())

    def token(self, namespace: str, name: str, expires_in: float = 3600, pod: str = "") -> str:
        """A projected service-account token for the TrainJob's audience."""
        return self.issue(token_audience(namespace, name), namespace, expires_in, pod)

    def issue(self, audience: str, namespace: str, expires_in: float = 3600, pod: str = "") -> str:
        """What the kubelet gets from the TokenRequest API for a pod's serviceAccountToken
        projection: an ES256 JWT for `audience`, bound to the pod."""
        now = int(time.time())
        bound: dict[str, Any] = {"namespace": namespace}
        if pod:
            bound["pod"] = {"name": pod}
        payload = {
            "iss": "https://kubernetes.default.svc",
            "aud": [audience],
            "sub": f"system:serviceaccount:{namespace}:default",
            "iat": now,
            "nbf": now,
            "exp": now + int(expires_in),
            "kubernetes.io": bound,
        }
        return _sign_jwt(self.issuer_key, payload)

    def authorized(self, token: str, namespace: str, name: str) -> dict[str, Any] | None:
        """auth.go Authorize: signature, expiry, audience, then the namespace claim; the
        token's claims when it may update the TrainJob, else None."""
        claims = _verify_jwt(self.issuer_key.public_key(), token)
        if claims is None or claims.get("exp", 0) < time.time():
            return None
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if token_audience(namespace, name) not in audiences:
            return None
        if (claims.get("kubernetes.io") or {}).get("namespace") != namespace:
            return None
        return claims


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign_jwt(key: Any, payload: dict[str, Any]) -> str:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, utils

    header = _b64(json.dumps({"alg": "ES256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(payload).encode())
    der = key.sign(f"{header}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
    r, s = utils.decode_dss_signature(der)
    return f"{header}.{body}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _verify_jwt(public_key: Any, token: str) -> dict[str, Any] | None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, utils

    try:
        header, body, signature = token.split(".")
        raw = _unb64(signature)
        der = utils.encode_dss_signature(
            int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")
        )
        public_key.verify(der, f"{header}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
        claims = json.loads(_unb64(body))
    except (ValueError, InvalidSignature):
        return None
    return claims if isinstance(claims, dict) else None


def _make_tls(folder: Path, hosts: tuple[str, ...]) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for `hosts` (DNS names or IP addresses)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainer-status-test-ca")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    names = [_san(h) for h in hosts]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    paths = (folder / "ca.crt", folder / "server.crt", folder / "server.key")
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def _usage(cert_sign: bool) -> Any:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=not cert_sign,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _san(host: str) -> Any:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


# ---------------------------------------------------------------- the server
@dataclass
class Request:
    path: str
    authorization: str | None
    body: Any
    answered: int | None = None  # None: never answered (a hanging server)
    claims: dict[str, Any] | None = None  # of an accepted token

    @property
    def pod(self) -> str:
        """The pod the token is bound to ("" when none)."""
        bound = (self.claims or {}).get("kubernetes.io") or {}
        return (bound.get("pod") or {}).get("name", "")


class TrainerStatusServer:
    """Serves the status endpoint for `trainjobs` ({(namespace, name)}), records every request
    and each status it accepted. `answer_with(code)` answers every later request with that
    code; `hang()` reads requests and never answers; `drip()` answers 200 and then sends its
    body a byte at a time, a byte every 0.2 s, for ever (every read stays within any timeout)."""

    def __init__(
        self,
        credentials: Credentials,
        trainjobs: set[tuple[str, str]],
        listener: socket.socket | None = None,
    ) -> None:
        self.credentials, self.trainjobs = credentials, set(trainjobs)
        self.schema = trainer_status_schema()
        self.requests: list[Request] = []
        self.accepted: list[tuple[str, str, dict[str, Any]]] = []  # (ns, name, trainerStatus)
        self.forced: int | None = None
        self.hanging = False
        self.dripping = False
        self.release = threading.Event()
        self.lock = threading.Lock()
        handler = _handler(self)
        if listener is None:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        else:
            self.server = ThreadingHTTPServer(listener.getsockname()[:2], handler, False)
            self.server.socket.close()
            self.server.socket = listener
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(credentials.cert_file, credentials.key_file)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def url(self, namespace: str, name: str, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}{status_path(namespace, name)}"

    def answer_with(self, code: int | None) -> None:
        self.forced = code

    def hang(self) -> None:
        self.hanging = True

    def drip(self) -> None:
        self.dripping = True

    def statuses(self, namespace: str, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for ns, n, s in self.accepted if (ns, n) == (namespace, name)]

    def latest(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.statuses(namespace, name)
        return found[-1] if found else None

    def handle(self, request: Request, raw: bytes) -> tuple[int, dict]:
        """(HTTP code, body) for one POST, as server.go's handler answers it."""
        found = PATH.match(request.path)
        if not found:
            return _failure(404, "NotFound", "Not found")
        namespace, name = found.groups()
        parts = (request.authorization or "").split()
        token = parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else ""
        request.claims = self.credentials.authorized(token, namespace, name) if token else None
        if request.claims is None:
            return _failure(403, "Forbidden", "Forbidden")
        try:
            request = json.loads(raw) if len(raw) <= MAX_BODY else None
        except ValueError:
            request = None
        if not isinstance(request, dict) or set(request) - {"trainerStatus"}:
            return _failure(422, "Invalid", "Invalid payload")
        status = request.get("trainerStatus")
        if status is None:
            return 200, request
        problems = status_problems(status, self.schema)
        if problems:
            return _failure(422, "Invalid", "; ".join(problems))
        if (namespace, name) not in self.trainjobs:
            return _failure(404, "NotFound", "Train job not found")
        with self.lock:
            self.accepted.append((namespace, name, status))
        return 200, request

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _failure(code: int, reason: str, message: str) -> tuple[int, dict]:
    """server.go badRequest: a metav1.Status."""
    return code, {"status": "Failure", "message": message, "reason": reason, "code": code}


def _handler(owner: TrainerStatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(min(length, MAX_BODY + 1))
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw
            request = Request(self.path, self.headers.get("Authorization"), body)
            owner.requests.append(request)
            if owner.hanging:
                owner.release.wait(120)
                self.close_connection = True
                return
            if owner.dripping:
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 30))
                self.end_headers()
                while not owner.release.wait(0.2):
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        break
                self.close_connection = True
                return
            if owner.forced is not None:
                code, answer = _failure(owner.forced, "Forced", f"answered {owner.forced}")
            else:
                code, answer = owner.handle(request, raw)
            request.answered = code
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the mux's "/" pattern: handleDefault
            code, answer = _failure(404, "NotFound", "Not found")
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def running(
    folder: Path,
    trainjobs: set[tuple[str, str]],
    hosts: tuple[str, ...] = ("127.0.0.1",),
    listener: socket.socket | None = None,
) -> Iterator[TrainerStatusServer]:
    server = TrainerStatusServer(Credentials(folder, hosts), trainjobs, listener)
    server.thread.start()
    try:
        yield server
    finally:
        server.stop()


def pod_files(server: TrainerStatusServer, folder: Path, namespace: str, name: str) -> Path:
    """The projected volume the controller mounts at MOUNT_PATH: `ca.crt` and `token`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_bytes(server.credentials.ca_file.read_bytes())
    (folder / "token").write_text(server.credentials.token(namespace, name))
    return folder


def pod_env(server: TrainerStatusServer, folder: Path, namespace: str, name: str,
            host: str = "127.0.0.1") -> dict[str, str]:  # fmt: skip
    """The three variables trainjobstatus.go injects, pointing at `folder` (pod_files)."""
    return {
        ENV_URL: server.url(namespace, name, host),
        ENV_CA_CERT: str(folder / "ca.crt"),
        ENV_TOKEN: str(folder / "token"),
    }
