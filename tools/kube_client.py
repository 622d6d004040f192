"""The transport through the official `kubernetes` Python client (the `kube` extra): its
kubeconfig loader (exec plugins, OIDC, client certificates) and its urllib3 pool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubeddp.tools import kubeconfig as _kubeconfig
from kubeddp.tools.kube_errors import HttpStatusError, KubeError, StreamBroken, Unreachable
from kubeddp.tools.kube_transport import (
    KubeconfigChoice,
    Query,
    checked_server,
    in_cluster_namespace,
    no_kubeconfig,
)

HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}


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


class ClientTransport:
    def __init__(self, choice: KubeconfigChoice, context: str | None) -> None:
        from kubernetes import client, config
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
        self.api = client.ApiClient(configuration)

    def _call(
        self, method: str, path: str, query: Query, body: Any, timeout: Any, headers: Any
    ) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            response = self.api.call_api(
                path,
                method,
                query_params=query,
                body=body,
                header_params=headers,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
            return response[0] if isinstance(response, tuple) else response
        except ApiException as exc:
            raise HttpStatusError(exc.status, exc.reason, exc.body) from None
        except (HTTPError, OSError) as exc:
            raise _unreachable(exc) from None

    def send(
        self, method: str, path: str, query: Query, body: Any, timeout: tuple[int, int]
    ) -> bytes:
        from urllib3.exceptions import HTTPError

        response = self._call(method, path, query, body, timeout, HEADERS)
        try:
            return response.data  # read here: a server may hang or reset mid-body
        except (HTTPError, OSError) as exc:
            raise _unreachable(exc) from None

    def stream(self, path: str, query: Query, connect_timeout: int) -> Iterator[bytes]:
        """Only connecting is timed: a followed log may be quiet for hours."""
        from urllib3.exceptions import HTTPError

        response = self._call("GET", path, query, None, (connect_timeout, None), None)

        def lines() -> Iterator[bytes]:
            try:
                yield from response
            except (HTTPError, OSError) as exc:
                raise StreamBroken(type(exc).__name__) from None

        return lines()

    def close(self) -> None:
        pass  # the pool goes with the process
