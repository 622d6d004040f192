"""The transport through `kubectl proxy`, for machines with kubectl and without the Python
client: kubectl does all authentication (exec plugins, OIDC, client certificates) and
serves the API unauthenticated for as long as the command runs; kubeddp talks plain HTTP to
it, so status codes and Status bodies arrive as the API server sent them. It listens on a
Unix socket in a private folder (mode 0700: no other local user can use the credentials);
on Windows, on 127.0.0.1 with a free port.

The proxy is started for one command and stopped when it ends: by `close()` (the CLI calls
it on every exit, Ctrl-C included), at interpreter exit, and on Linux by the kernel when
kubeddp itself is killed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import http.client
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

from kubeddp.tools.cluster import kubeconfig as _kubeconfig
from kubeddp.tools.cluster.kube_errors import (
    HttpStatusError,
    KubeError,
    KubeInputError,
    StreamBroken,
    Unreachable,
)
from kubeddp.tools.cluster.kube_transport import (
    KubeconfigChoice,
    Query,
    checked_server,
    in_cluster_namespace,
    lines_as_they_come,
    no_kubeconfig,
)

KUBECTL_ENV = "KUBEDDP_KUBECTL"  # another kubectl binary (a path or a name on PATH)
NEEDS = (
    "the cluster commands need kubectl on PATH (or ${env} naming it) or the Kubernetes "
    "Python client: install kubectl, or pip install 'kubeddp[kube]'"
)
START_SECONDS = 15  # kubectl reads the kubeconfig and listens; it dials nothing yet
SERVING = re.compile(rb"Starting to serve on (\S+)")
UNIX_SOCKETS = hasattr(socket, "AF_UNIX") and sys.platform != "win32"
STOP_SECONDS = 5
END_SECONDS = 1.0  # how long an exited kubectl takes to be reaped, at most
POLL_SECONDS = 0.1  # how often a wait for kubectl's output looks whether kubectl still runs
OWN_GROUP = hasattr(os, "killpg")  # POSIX: kubectl runs in a process group of its own
# What kubectl proxy answers (500, text/plain, a Go error) when it cannot get an answer from
# the API server; a real API server's own errors are Status objects in JSON.
UPSTREAM_FAILURE = re.compile(
    r"^(dial tcp|dial unix|EOF|unexpected EOF|read tcp|write tcp|tls:|x509:|net/http:|"
    r"context deadline exceeded|http: server gave|malformed HTTP|proxyconnect)"
)
CREDENTIALS_FAILURE = re.compile(r"getting credentials|exec plugin|Unauthorized|oidc|refresh")
_OPEN: weakref.WeakSet[KubectlProxy] = weakref.WeakSet()


def kubectl_binary() -> str | None:
    wanted = os.environ.get(KUBECTL_ENV) or "kubectl"
    return shutil.which(wanted)


def close_all() -> None:
    """Stop every proxy this process started (the CLI's last step, also after Ctrl-C)."""
    for proxy in list(_OPEN):
        proxy.close()


atexit.register(close_all)


def _die_with_parent() -> None:  # in the child, before exec: SIGTERM when kubeddp dies
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)  # the Host kubectl proxy accepts
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class KubectlProxy:
    """One `kubectl proxy` process and where it serves: a Unix socket, or a free local port."""

    def __init__(self, kubectl: str, options: list[str]) -> None:
        self.errors: list[str] = []  # its last stderr lines
        self.folder = tempfile.mkdtemp(prefix="kubeddp-kubectl-") if UNIX_SOCKETS else None
        where = (
            [f"--unix-socket={os.path.join(self.folder, 'api.sock')}"]
            if self.folder
            else ["--port=0", "--address=127.0.0.1"]
        )
        try:
            self.process = subprocess.Popen(
                [kubectl, "proxy", *where, *options],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                # its own process group: a wrapper script's children (which may hold the pipes
                # open) end with it
                start_new_session=OWN_GROUP,
            )
        except OSError as exc:  # not executable, not a program
            if self.folder:
                shutil.rmtree(self.folder, ignore_errors=True)
            raise KubeInputError(
                f"cannot run kubectl {kubectl} ({exc.strerror or exc}); install kubectl, or "
                f"set ${KUBECTL_ENV} to a working one"
            ) from None
        _OPEN.add(self)
        try:
            self.address = self._wait_until_serving()
        except BaseException:
            self.close()
            raise
        # kubectl logs every failed request on stderr: read it so the pipe never fills.
        threading.Thread(target=self._drain, daemon=True, name="kubectl-proxy-stderr").start()

    def connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.folder:
            return _UnixConnection(self.address, timeout)
        return http.client.HTTPConnection(self.address, timeout=timeout)

    def _wait_until_serving(self) -> str:
        assert self.process.stdout is not None
        seen = _read_until(self.process.stdout, b"\n", START_SECONDS, self.process)
        found = SERVING.search(seen)
        if found:
            return found.group(1).decode(errors="replace")
        try:  # its stdout ended a moment before its exit status can be read
            ended = self.process.wait(timeout=END_SECONDS)
        except subprocess.TimeoutExpired:
            ended = None  # still running: it never said it serves
        self.close()
        why = b"" if self.process.stderr is None else _read_until(self.process.stderr, None, 1)
        why_text = " ".join(why.decode(errors="replace").split()).removeprefix("error: ")[:300]
        if not why_text:
            why_text = (
                f"it did not start serving within {START_SECONDS}s"
                if ended is None
                else f"it ended with exit code {ended} without serving"
            )
        raise KubeError(f"kubectl proxy failed: {why_text}; fix the kubeconfig or --context")

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.errors = [*self.errors[-9:], line.decode(errors="replace").strip()]

    def close(self) -> None:
        _OPEN.discard(self)
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
        self._signal(signal.SIGKILL)  # what a wrapper left behind holding the pipes
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _signal(self, number: int) -> None:
        """kubectl and whatever a wrapper script started beside it (its process group)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if OWN_GROUP:
                os.killpg(self.process.pid, number)
            elif self.process.poll() is None:
                self.process.send_signal(number)


def _read_until(
    stream: Any, end: bytes | None, seconds: float, process: subprocess.Popen | None = None
) -> bytes:
    """What `stream` gives within `seconds`, up to `end` (None: up to end of file). Never
    waits for the end of file itself: a child of a kubectl wrapper may hold the pipe open long
    after kubectl ended, so a `process` that exited stops the wait too."""
    seen, deadline = b"", time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while time.monotonic() < deadline and (end is None or end not in seen):
            if selector.select(min(POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
                chunk = os.read(stream.fileno(), 4096)
                if not chunk:
                    break  # end of file
                seen += chunk
            elif process is not None and process.poll() is not None:
                break  # ended, and nothing more came within a poll
    return seen


def _kubectl_options(choice: KubeconfigChoice, context: str | None) -> list[str]:
    # A $KUBECONFIG list reaches kubectl through the environment, which it merges itself.
    options = ["--kubeconfig", choice.path] if choice.explicit else []
    return options + (["--context", context] if context else [])


def _from_kubeconfig(choice: KubeconfigChoice, context: str | None) -> tuple[str, str | None]:
    """The chosen context's server and namespace, read as kubectl reads them."""
    try:
        data = _kubeconfig.merge(choice.merged) if choice.merged else _kubeconfig.read(choice.path)
    except _kubeconfig.KubeconfigError as exc:
        raise KubeError(str(exc)) from None
    name = context or data.get("current-context")
    contexts = {c.get("name"): c.get("context") for c in _entries(data, "contexts")}
    if not name or not isinstance(contexts.get(name), dict):
        chosen = f"no context {name!r}" if name else "no current-context"
        raise KubeError(
            f"kubeconfig {choice.path} cannot be used ({chosen}); fix it or pass "
            "--kubeconfig/--context"
        )
    entry = contexts[name]
    clusters = {c.get("name"): c.get("cluster") for c in _entries(data, "clusters")}
    cluster = clusters.get(entry.get("cluster"))
    server = cluster.get("server") if isinstance(cluster, dict) else None
    return checked_server(server), entry.get("namespace")


def _entries(data: dict, section: str) -> list[dict]:
    entries = data.get(section)
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


class _ProxyLogStream:
    """A followed log through kubectl proxy; `close()` shuts its socket down from any thread."""

    def __init__(
        self,
        connection: http.client.HTTPConnection,
        sock: socket.socket,
        response: http.client.HTTPResponse,
    ) -> None:
        self.connection, self.sock, self.response = connection, sock, response
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from lines_as_they_come(self.response.read1)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if not self.closed.is_set():
                raise StreamBroken(type(exc).__name__) from None
        finally:
            self.connection.close()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class ProxyTransport:
    def __init__(
        self, choice: KubeconfigChoice, context: str | None, timeout: tuple[int, int]
    ) -> None:
        if choice.exists:
            self.host, self.namespace = _from_kubeconfig(choice, context)
        elif choice.explicit or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise no_kubeconfig(choice, context)
        else:  # in a pod: kubectl uses the service account as the client would
            service = os.environ["KUBERNETES_SERVICE_HOST"]
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            self.host = f"https://{service}:{port}"
            self.namespace = in_cluster_namespace()
        kubectl = kubectl_binary()
        if kubectl is None:
            raise KubeInputError(NEEDS.replace("${env}", f"${KUBECTL_ENV}"))
        self.proxy = KubectlProxy(kubectl, _kubectl_options(choice, context))

    def _open(
        self, method: str, path: str, query: Query, body: Any, timeout: float | None
    ) -> tuple[http.client.HTTPConnection, socket.socket, http.client.HTTPResponse]:
        """The connection, its socket (http.client may let go of it once the answer begins)
        and the answer, its body not read yet."""
        target = f"{path}?{urlencode(query)}" if query else path
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        connection = self.proxy.connection(timeout)
        try:
            connection.request(method, target, body=data, headers=headers)
            sock = connection.sock
            response = connection.getresponse()
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            connection.close()
            raise self._unreachable(exc) from None
        if response.status >= 400:
            answer = self._read(response)
            connection.close()
            self._raise_for(response, answer)
        return connection, sock, response

    def _unreachable(self, exc: BaseException) -> Unreachable:
        name = type(exc).__name__
        if isinstance(exc, TimeoutError):
            return Unreachable("timeout", name)
        if self.proxy.process.poll() is not None:  # kubectl itself is gone: say its last word
            said = self.proxy.errors[-1:] or [f"exit {self.proxy.process.returncode}"]
            return Unreachable("refused", f"kubectl proxy ended: {said[0][:200]}")
        if isinstance(exc, http.client.HTTPException):
            return Unreachable("protocol", name)
        return Unreachable("refused", name)

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        try:
            return response.read()
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc) from None

    def _raise_for(self, response: http.client.HTTPResponse, answer: bytes) -> None:
        text = " ".join(answer.decode(errors="replace").split())
        from_proxy = response.status >= 500 and "text/plain" in (
            response.getheader("Content-Type") or ""
        )
        if from_proxy and UPSTREAM_FAILURE.match(text):
            raise Unreachable("timeout" if "deadline" in text else "refused", text[:160])
        if from_proxy and CREDENTIALS_FAILURE.search(text):
            raise KubeError(
                f"kubectl could not get credentials for the API server at {self.host} "
                f"({text[:200]}); log in again or check the kubeconfig's user"
            )
        raise HttpStatusError(response.status, response.reason, answer)

    def send(
        self, method: str, path: str, query: Query, body: Any, timeout: tuple[int, int]
    ) -> bytes:
        connection, _, response = self._open(method, path, query, body, float(timeout[1]))
        try:
            return self._read(response)
        finally:
            connection.close()

    def stream(self, path: str, query: Query, connect_timeout: int) -> _ProxyLogStream:
        connection, sock, response = self._open("GET", path, query, None, float(connect_timeout))
        sock.settimeout(None)  # a followed log may be quiet for hours
        return _ProxyLogStream(connection, sock, response)

    def close(self) -> None:
        self.proxy.close()
