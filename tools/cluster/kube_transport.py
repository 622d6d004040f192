"""What the two transports of the cluster commands share: the interface, and where the API
server is (the kubeconfig kubectl would choose, or the pod's service account).

The transports: the official `kubernetes` client when it is installed (the `kube` extra,
tools/cluster/kube_client.py), else `kubectl proxy` (tools/cluster/kubectl_proxy.py), so a laptop
with kubectl needs no 126 MiB client. Both send the same REST calls and raise the same errors
(tools/cluster/kube_errors.py); tools/cluster/kube.py picks one, checks and explains the answers
for both."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from kubeddp.tools.cluster import kubeconfig as _kubeconfig
from kubeddp.tools.cluster.kube_errors import KubeError

IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
Query = list[tuple[str, Any]]


class Transport(Protocol):
    host: str  # the API server's URL, for messages
    namespace: str | None  # the kubeconfig context's (or the pod's service account's)

    def send(
        self, method: str, path: str, query: Query, body: Any, timeout: tuple[int, int]
    ) -> bytes:
        """The answer's body; HttpStatusError on an error status, Unreachable without one."""

    def stream(self, path: str, query: Query, connect_timeout: int) -> LogStream:
        """A streaming GET's lines; errors as `send`, a break mid-stream as StreamBroken."""

    def close(self) -> None: ...


class LogStream(Protocol):
    """The lines of a streaming answer (a followed pod log)."""

    def __iter__(self) -> Iterator[bytes]: ...

    def close(self) -> None:
        """End the stream from any thread: a read waiting for the next line returns, and the
        iteration stops without an error (a job that ended leaves no pod followed)."""


@dataclass(frozen=True)
class KubeconfigChoice:
    """The kubeconfig a command uses, chosen as kubectl chooses it."""

    path: str  # --kubeconfig, the first existing $KUBECONFIG file, or ~/.kube/config
    merged: list[str] | None  # several existing $KUBECONFIG files: merged as kubectl does
    explicit: bool  # --kubeconfig was given

    @property
    def exists(self) -> bool:
        return Path(self.path).is_file()


def choose_kubeconfig(kubeconfig: str | None) -> KubeconfigChoice:
    listed = [] if kubeconfig else _kubeconfig.paths_from_env(os.environ.get("KUBECONFIG", ""))
    existing = [p for p in listed if Path(p).is_file()]
    path = (
        kubeconfig
        or (existing[0] if existing else None)
        or (os.pathsep.join(listed) if listed else str(Path.home() / ".kube" / "config"))
    )
    return KubeconfigChoice(path, existing if len(existing) > 1 else None, bool(kubeconfig))


def no_kubeconfig(choice: KubeconfigChoice, context: str | None) -> KubeError:
    """The error when the kubeconfig is missing; in a pod the caller tries in-cluster first."""
    if choice.explicit or context:
        return KubeError(
            f"no kubeconfig at {choice.path}; pass --kubeconfig PATH or set KUBECONFIG"
        )
    return KubeError(
        f"no Kubernetes credentials: no kubeconfig at {choice.path} and not in a pod; set "
        "KUBECONFIG or pass --kubeconfig PATH"
    )


def checked_server(host: str | None) -> str:
    server = urlsplit(host or "")
    if server.scheme not in ("http", "https") or not server.hostname:
        raise KubeError(
            f"the cluster's server {host!r} is not an http(s) URL; fix the server of the "
            "cluster in the kubeconfig (e.g. https://10.0.0.1:6443)"
        )
    return str(host)


def in_cluster_namespace() -> str | None:
    ns_file = Path(IN_CLUSTER_NAMESPACE_FILE)
    return ns_file.read_text().strip() if ns_file.is_file() else None


READ_SIZE = 65536


def lines_as_they_come(read1: Callable[[int], bytes]) -> Iterator[bytes]:
    """The lines of a streamed answer, each as soon as it has arrived: `read1` returns what
    one read gives (a whole-buffer read would wait for 64 KiB of a quiet log)."""
    pending = b""
    while chunk := read1(READ_SIZE):
        *whole, pending = (pending + chunk).split(b"\n")
        for line in whole:
            yield line + b"\n"
    if pending:
        yield pending
