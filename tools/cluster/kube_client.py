"""The transport through the official `kubernetes` Python client (the `kube` extra): its
kubeconfig loader (exec plugins, OIDC, client certificates) and the TLS setup it makes from
that kubeconfig.

Only the client's stable public surface is used: `Configuration` (filled by the kubeconfig
loader; `auth_settings()` gives the current bearer token and refreshes an expiring one) and the
urllib3 pool its REST layer builds from it (certificates, proxy, TLS server name). The
requests are kubeddp's own: `ApiClient.call_api` is generated code whose arguments changed
completely in kubernetes 37, and kubeddp needs nothing of it but a GET, POST or DELETE of a
path.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from kubeddp.tools.cluster import kubeconfig as _kubeconfig
from kubeddp.tools.cluster.kube_errors import HttpStatusError, KubeError, StreamBroken, Unreachable
from kubeddp.tools.cluster.kube_transport import (
    KubeconfigChoice,
    Query,
    checked_server,
    in_cluster_namespace,
    lines_as_they_come,
    no_kubeconfig,
)
from kubeddp.trainer import __version__

# Imported in functions: kubernetes and urllib3, the `kube` extra: optional (kube.py uses `kubectl
# proxy` without it).

USER_AGENT = f"kubeddp/{__version__}"


def _load_kubeconfig(
    path: str, context: str | None, configuration: Any, merged_from: list[str] | None = None
) -> str | None:
    """Read the kubeconfig through kubeddp's bounded YAML reader (several $KUBECONFIG files
    merged as kubectl does), set up `configuration`; the namespace of the chosen context."""
    from kubernetes.config.kube_config import ConfigException, KubeConfigLoader

    try:
        data = _kubeconfig.merge(merged_from) if merged_from else _kubeconfig.read(path)
    except _kubeconfig.KubeconfigError as exc:
        raise KubeError(str(exc)) from None
    try:
        loader = KubeConfigLoader(
            config_dict=data,
            active_context=context,
            config_base_path=str(Path(path).resolve().parent),
        )
        loader.load_and_set(configuration)
        chosen = loader.current_context or {}
        return (chosen.get("context") or {}).get("namespace")
    except Exception as exc:  # noqa: BLE001 - the client fails on a bad file in many ways
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        if not isinstance(exc, ConfigException):
            why = f"{type(exc).__name__}: {why}"
        raise KubeError(
            f"kubeconfig {path} cannot be used ({why}); fix it or pass --kubeconfig/--context"
        ) from None


def _unreachable(exc: BaseException) -> Unreachable:
    exc = getattr(exc, "reason", None) or exc  # urllib3's MaxRetryError wraps the cause
    name = type(exc).__name__
    if name == "ConnectTimeoutError":
        return Unreachable("connect-timeout", name)
    if "Timeout" in name or isinstance(exc, TimeoutError):
        return Unreachable("timeout", name)
    if name == "ProtocolError":  # connected, then no valid HTTP answer
        return Unreachable("protocol", name)
    return Unreachable("refused", name)


class _ClientLogStream:
    """A followed log through urllib3; `close()` shuts its socket down from any thread."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        from urllib3.exceptions import HTTPError

        try:
            yield from lines_as_they_come(self.response.read1)
        except (HTTPError, OSError, ValueError) as exc:  # ValueError: read after close
            if not self.closed.is_set():
                raise StreamBroken(type(exc).__name__) from None
        finally:
            self.response.release_conn()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.response.shutdown()  # urllib3 2.3+: a read blocked on the socket returns


class ClientTransport:
    def __init__(self, choice: KubeconfigChoice, context: str | None) -> None:
        from kubernetes import client, config
        from kubernetes.client.rest import RESTClientObject
        from urllib3.util.retry import Retry

        configuration = client.Configuration()
        # Retry a failed connection once; never a request that was sent (a read timeout).
        configuration.retries = Retry(total=1, connect=1, read=0, redirect=0, status=0, other=0)
        self.namespace: str | None = None
        if choice.exists:
            self.namespace = _load_kubeconfig(choice.path, context, configuration, choice.merged)
        elif choice.explicit or context:
            raise no_kubeconfig(choice, context)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                raise no_kubeconfig(choice, context) from None
            self.namespace = in_cluster_namespace()
        self.host = checked_server(configuration.host)
        self.configuration = configuration
        self.retries = configuration.retries
        self.pool = RESTClientObject(configuration).pool_manager

    def _headers(self, with_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if with_body:
            headers["Content-Type"] = "application/json"
        for auth in self.configuration.auth_settings().values():  # refreshes an exec token
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def _open(
        self, method: str, path: str, query: Query, body: Any, timeout: tuple[int, int | None]
    ) -> Any:
        """The response, its body not read yet; an error status raises HttpStatusError."""
        import urllib3
        from urllib3.exceptions import HTTPError

        url = self.host.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        try:
            response = self.pool.request(
                method,
                url,
                body=data,
                headers=self._headers(data is not None),
                timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
                retries=self.retries,
                preload_content=False,
            )
        except (HTTPError, OSError) as exc:
            raise _unreachable(exc) from None
        if not 200 <= response.status <= 299:
            answer = self._read(response)
            raise HttpStatusError(response.status, response.reason or "", answer)
        return response

    def _read(self, response: Any) -> bytes:
        from urllib3.exceptions import HTTPError

        try:
            return response.read()  # read here: a server may hang or reset mid-body
        except (HTTPError, OSError) as exc:
            raise _unreachable(exc) from None
        finally:
            response.release_conn()

    def send(
        self, method: str, path: str, query: Query, body: Any, timeout: tuple[int, int]
    ) -> bytes:
        return self._read(self._open(method, path, query, body, timeout))

    def stream(self, path: str, query: Query, connect_timeout: int) -> _ClientLogStream:
        """Only connecting is timed: a followed log may be quiet for hours."""
        return _ClientLogStream(self._open("GET", path, query, None, (connect_timeout, None)))

    def close(self) -> None:
        self.pool.clear()
