"""Talk to the Kubernetes API: connect, create, read, delete, logs, through the official client
or kubectl proxy (tools/cluster/kube_transport.py), with the same checks and messages for both.

Every API failure becomes a `KubeError` whose one-line message says what to do: install the
missing operator (with the exact command), ask for RBAC (k8s/rbac.yaml), fix the kubeconfig.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from kubeddp.tools.cluster.kube_errors import (
    AdmissionRefused,
    HttpStatusError,
    KubeError,
    KubeInputError,
    Unreachable,
)
from kubeddp.tools.cluster.kube_transport import LogStream, Transport, choose_kubeconfig
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.patterns import DNS1123_LABEL, DNS1123_SUBDOMAIN
from kubeddp.tools.manifests.resources import COMPANION_RESOURCES, POD, POD_MONITOR, Resource
from kubeddp.trainer.deadline import DeadlineExceeded, call_within

# Imported in functions: only the transport chosen: kubectl_proxy (52 modules: subprocess, http,
# ssl) or kube_client (the `kube` extra).

__all__ = ["Cluster", "Expected", "KubeError", "KubeInputError", "explain", "object_path"]

INSTALL_HINTS = {  # by API group: what to install when its API is missing
    **{kind.resource.group: kind.install_hint for kind in KINDS.values() if kind.install_hint},
    POD_MONITOR.group: "install the Prometheus Operator (kube-prometheus-stack), or render "
    "without --podmonitor",
}
RBAC_HINT = "ask an admin to apply k8s/rbac.yaml (Role kubeddp-submitter) and bind it to you"
DEFAULT_REQUEST_TIMEOUT = 30  # seconds a call may wait for the API server's answer
CONNECT_TIMEOUT = 10
MAX_NAME = 253  # object names: DNS-1123 subdomains
MAX_LABEL = 63  # namespaces: DNS-1123 labels


RESOURCES = {
    resource.key: resource
    for resource in (*COMPANION_RESOURCES, *(kind.resource for kind in KINDS.values()))
}


def resource_for(doc: dict) -> Resource:
    key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    if key not in RESOURCES:
        known = ", ".join(sorted(r.kind for r in RESOURCES.values()))
        raise KubeInputError(
            f"cannot submit {key}: kubeddp sends only {known}; use kubectl for others"
        )
    return RESOURCES[key]


def checked_name(name: object, what: str) -> str:
    """`name` if it can be an object name (a DNS-1123 subdomain) else KubeInputError: a name
    becomes part of the request's URL, so '../x' or 'x?dryRun=All' must never get there."""
    if not isinstance(name, str) or len(name) > MAX_NAME or not DNS1123_SUBDOMAIN.match(name):
        raise KubeInputError(
            f"{what} {name!r} is not a Kubernetes name: use {DNS1123_SUBDOMAIN.means}, at "
            f"most {MAX_NAME} characters"
        )
    return name


def checked_namespace(namespace: object) -> str:
    if (
        not isinstance(namespace, str)
        or len(namespace) > MAX_LABEL
        or not DNS1123_LABEL.match(namespace)
    ):
        raise KubeInputError(
            f"namespace {namespace!r} is not a namespace name: use {DNS1123_LABEL.means}, at "
            f"most {MAX_LABEL} characters"
        )
    return namespace


def object_path(resource: Resource, namespace: str, name: str | None = None) -> str:
    """The REST path of a collection or of one object, from checked names only."""
    path = resource.collection_path(checked_namespace(namespace))
    return path if name is None else f"{path}/{checked_name(name, resource.kind.lower())}"


def _not_json(data: bytes) -> str:
    start = data[:60].decode(errors="replace")
    return " ".join(start.split())


def open_transport(
    kubeconfig: str | None, context: str | None, timeout: tuple[int, int]
) -> Transport:
    """The client when `kubernetes` imports, else kubectl; neither: one line (exit 2)."""
    try:
        import kubernetes.client  # noqa: F401 - only whether it is there
    except ImportError:
        from kubeddp.tools.cluster.kubectl_proxy import ProxyTransport

        return ProxyTransport(choose_kubeconfig(kubeconfig), context, timeout)
    from kubeddp.tools.cluster.kube_client import ClientTransport

    return ClientTransport(choose_kubeconfig(kubeconfig), context)


class Cluster:
    """A transport to the API server plus the namespace to use; calls return plain JSON dicts.

    Every request goes through `request`: names are checked before a URL is made, every call
    has a connect and a read timeout (whole seconds: the client ignores a float), and any
    failure -- refused, reset, timed out, an answer that is not the API's JSON -- becomes a
    one-line KubeError.
    """

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        request_timeout: int = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        # (connect, read) in whole seconds: the kubernetes client drops a float timeout.
        seconds = max(1, int(request_timeout))
        self.timeout = (min(CONNECT_TIMEOUT, seconds), seconds)
        self.total_seconds = float(seconds)  # the whole call, connect to the answer's last byte
        if namespace is not None:
            checked_namespace(namespace)
        self.transport: Transport = open_transport(kubeconfig, context, self.timeout)
        self.host = self.transport.host
        try:
            self.namespace = checked_namespace(namespace or self.transport.namespace or "default")
        except KubeError:
            self.transport.close()
            raise

    def close(self) -> None:
        """Stop what the transport started (kubectl proxy); the command calls it at its end."""
        self.transport.close()

    def with_timeout(self, seconds: float) -> Cluster:
        """The same connection (and kubectl proxy) with another request timeout."""
        other = copy.copy(self)
        whole = max(1, int(seconds))
        other.timeout = (min(CONNECT_TIMEOUT, whole), whole)
        other.total_seconds = float(whole)
        return other

    def _unreachable(self, exc: Unreachable) -> KubeError:
        host = self.host
        if exc.how == "connect-timeout":
            return KubeError(
                f"the API server at {host} did not accept a connection within "
                f"{self.timeout[0]}s; check --context/--kubeconfig and that the cluster is up"
            )
        if exc.how == "timeout":
            return KubeError(
                f"the API server at {host} did not answer within {self.timeout[1]}s "
                f"({exc.name}); check that the cluster is up, or raise --request-timeout"
            )
        if exc.how == "protocol":
            return KubeError(
                f"the API server at {host} closed the connection without a valid answer "
                f"({exc.name}); check that the kubeconfig's server is a Kubernetes API server"
            )
        return KubeError(
            f"cannot reach the API server at {host} ({exc.name}); "
            "check --context/--kubeconfig and that the cluster is up"
        )

    def request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        what: str = "",
        expect: Expected | None = None,
        text: bool = False,
    ) -> Any:
        """One REST call; JSON in, a JSON object (or, for a log or `text`, the text) out,
        errors explained.

        The whole call, answer included, ends within the request timeout: the client's
        timeouts bound each read, so a server that drips its answer a byte at a time would
        otherwise hold the command for as long as it likes. `expect`: the kind (and name) the
        answer must be; anything else is not believed.
        """
        try:
            answer = call_within(
                self.total_seconds,
                f"{method} {path}",
                lambda: self._request(method, path, query, body, what, text),
            )
        except DeadlineExceeded:  # left behind: a daemon thread, gone with the process
            raise KubeError(
                f"the API server at {self.host} did not answer within "
                f"{self.total_seconds:g}s ({method} {path}: not the whole answer in that time); "
                "check that the cluster is up, or raise --request-timeout"
            ) from None
        if expect is not None:
            expect.check(answer, method, path, self.host)
        return answer

    def _request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]] | None,
        body: Any,
        what: str,
        text: bool = False,
    ) -> Any:
        try:
            data = self.transport.send(method, path, query or [], body, self.timeout)
        except HttpStatusError as exc:
            denial = webhook_denial(exc)
            if denial:
                raise AdmissionRefused(
                    explain(exc, method, path, what), denial, exc.status
                ) from None
            raise KubeError(explain(exc, method, path, what), exc.status) from None
        except Unreachable as exc:
            raise self._unreachable(exc) from None
        if text or path.endswith("/log"):
            return data.decode(errors="replace")
        try:
            answer = json.loads(data) if data else {}
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
            answer = None
        if not isinstance(answer, dict):
            raise KubeError(
                f"the API server at {self.host} answered {method} {path} "
                f"with something that is not a Kubernetes object ({_not_json(data)!r}); check "
                "that the kubeconfig's server is a Kubernetes API server"
            )
        return answer

    def stream(self, path: str, query: list[tuple[str, Any]]) -> LogStream:
        """A streaming GET (logs --follow): its lines. Its answer must begin within the
        request timeout (a server that never sends its headers would hold the command without a
        word); then a followed log may be quiet for hours. A break mid-stream raises
        StreamBroken (an OSError)."""
        try:
            return call_within(
                self.total_seconds,
                f"GET {path}",
                lambda: self.transport.stream(path, query, self.timeout[0]),
            )
        except DeadlineExceeded:
            raise self._log_not_begun(path) from None
        except HttpStatusError as exc:
            raise KubeError(explain(exc, "GET", path, "pods/log"), exc.status) from None
        except Unreachable as exc:
            if exc.how == "timeout":  # kubectl proxy's socket times the wait for the headers
                raise self._log_not_begun(path) from None  # too: which timer fires is a race
            raise self._unreachable(exc) from None

    def _log_not_begun(self, path: str) -> KubeError:
        return KubeError(
            f"the API server at {self.host} did not begin the log within "
            f"{self.total_seconds:g}s (GET {path}); check that the cluster is up, or raise "
            "--request-timeout"
        )

    def create(self, doc: dict, dry_run: bool = False) -> dict:
        resource = resource_for(doc)
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        if meta.get("name") is not None:
            checked_name(meta["name"], resource.kind.lower())
        namespace = meta.get("namespace") or self.namespace
        query = [("dryRun", "All")] if dry_run else []
        return self.request(
            "POST", object_path(resource, namespace), query, doc, resource.full_name,
            Expected(resource, meta.get("name")),
        )  # fmt: skip

    def get(self, resource: Resource, name: str) -> dict:
        return self.request(
            "GET", object_path(resource, self.namespace, name), what=resource.full_name,
            expect=Expected(resource, name),
        )  # fmt: skip

    def delete(self, resource: Resource, name: str) -> dict:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        return self.request(
            "DELETE",
            object_path(resource, self.namespace, name),
            body=body,
            what=resource.full_name,
            expect=Expected(resource, name, deleted=True),
        )

    def list_objects(self, resource: Resource, selector: str) -> list[dict]:
        """The objects that match, sorted by name; each has a checked metadata.name."""
        data = self.request(
            "GET",
            object_path(resource, self.namespace),
            [("labelSelector", selector)],
            what=resource.full_name,
            expect=Expected(resource, listed=True),
        )
        items = data.get("items") or []
        if not isinstance(items, list):
            raise KubeError(
                f"the API server's {resource.plural} list has items of type "
                f"{type(items).__name__}; check that the kubeconfig's server is a Kubernetes "
                "API server"
            )
        for item in items:
            meta = item.get("metadata") if isinstance(item, dict) else None
            checked_name(
                meta.get("name") if isinstance(meta, dict) else None, resource.kind.lower()
            )
        return sorted(items, key=lambda item: item["metadata"]["name"])

    def storage_classes(self) -> list[dict]:
        """The cluster's StorageClasses (cluster-scoped: a namespaced Role may not read them)."""
        data = self.request(
            "GET", "/apis/storage.k8s.io/v1/storageclasses", what="storageclasses",
            expect=Expected(STORAGE_CLASS, listed=True),
        )  # fmt: skip
        return [item for item in data["items"] if isinstance(item, dict)]

    def list_pods(self, selector: str) -> list[dict]:
        return self.list_objects(POD, selector)

    def pod_log(self, pod: str, container: str, tail_lines: int | None = None) -> str:
        query: list[tuple[str, Any]] = [("container", container)]
        if tail_lines is not None:
            query.append(("tailLines", tail_lines))
        path = f"{object_path(POD, self.namespace, pod)}/log"
        return self.request("GET", path, query, what="pods/log")

    def crd_schemas(self, keys: list[str]) -> dict[str, dict]:
        """openAPIV3Schema of the installed CRDs (served version) keyed by apiVersion/kind."""
        out = {}
        for key in keys:
            if key not in RESOURCES:
                continue
            crd_name = RESOURCES[key].full_name  # a CRD is named plural.group
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}"
            crd = self.request(
                "GET", path, what="customresourcedefinitions", expect=Expected(CRD, crd_name)
            )
            version = key.split("/")[-2]
            spec = crd.get("spec") if isinstance(crd.get("spec"), dict) else {}
            versions = spec.get("versions") if isinstance(spec.get("versions"), list) else []
            for served in versions:
                if not isinstance(served, dict):
                    continue
                schema = served.get("schema") if isinstance(served.get("schema"), dict) else {}
                if served.get("name") == version and served.get("served"):
                    if not isinstance(schema.get("openAPIV3Schema"), dict):
                        raise KubeError(
                            f"CRD {crd_name} has no openAPIV3Schema for {version}; validate "
                            "with --validate-against offline"
                        )
                    out[key] = schema["openAPIV3Schema"]
            if key not in out:
                group = crd_name.split(".", 1)[1]
                raise KubeError(f"CRD {crd_name} does not serve {version}; {INSTALL_HINTS[group]}")
        return out


STORAGE_CLASS = Resource("StorageClass", "storage.k8s.io", "v1", "storageclasses")
CRD = Resource(
    "CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions"
)


@dataclass(frozen=True)
class Expected:
    """What an answer must be: an object of this kind (and name), its list, or, for a
    DELETE, the object or a Status of Success. A server that answers `{}` to everything,
    or a Pod to a PyTorchJob request, is not believed."""

    resource: Resource
    name: str | None = None
    listed: bool = False
    deleted: bool = False

    def problem(self, answer: dict) -> str | None:
        kind, api_version = answer.get("kind"), answer.get("apiVersion")
        if self.deleted and kind == "Status":
            return None if answer.get("status") == "Success" else "a Status that is not Success"
        want = f"{self.resource.kind}List" if self.listed else self.resource.kind
        if (kind, api_version) != (want, self.resource.api_version):
            shown = f"{kind} {api_version}" if kind or api_version else "no kind"
            return f"{shown} where {want} {self.resource.api_version} was asked for"
        if self.listed:
            return None if isinstance(answer.get("items"), list) else "a list without items"
        meta = answer.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if self.name is not None and name != self.name:
            return f"{want} {name!r} where {self.name!r} was asked for"
        return None

    def check(self, answer: Any, method: str, path: str, host: str) -> None:
        problem = self.problem(answer) if isinstance(answer, dict) else "not an object"
        if problem:
            raise KubeError(
                f"the API server at {host} answered {method} {path} with {problem}; nothing is "
                "believed from it: check that the kubeconfig's server is a Kubernetes API "
                "server (and the operator's version)"
            )


def _status_body(exc: Any) -> dict:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}


WEBHOOK_DENIAL = "admission webhook "  # how the API server starts a webhook's refusal


def webhook_denial(exc: Any) -> str:
    """The API server's message when an admission webhook refused the request, else ''."""
    message = _status_body(exc).get("message")
    return message if isinstance(message, str) and message.startswith(WEBHOOK_DENIAL) else ""


def _group_of(path: str) -> str:
    parts = path.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "apis" else ""


def explain(exc: Any, method: str, path: str, what: str) -> str:
    """An error answer (status, reason, Status body) -> one line with the fix."""
    status = _status_body(exc)
    details = status.get("details") if isinstance(status.get("details"), dict) else {}
    verb = {"POST": "create", "GET": "get", "DELETE": "delete"}.get(method, method.lower())
    parts = path.split("/")
    namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts else ""
    if verb == "get" and namespace and len(parts) == parts.index("namespaces") + 3:
        verb = "list"  # a GET of the collection (/namespaces/NS/PLURAL), RBAC's "list"
    group = _group_of(path)
    if exc.status == 404:
        if path.startswith("/apis/apiextensions.k8s.io/"):
            crd = path.rsplit("/", 1)[-1]
            hint = INSTALL_HINTS.get(crd.split(".", 1)[1], "install its operator")
            return f"CRD {crd} is not installed; {hint}"
        if details.get("kind") == "namespaces":
            return f"namespace {namespace!r} does not exist; create it or pass -n NAMESPACE"
        if details.get("name"):
            return (
                f"{what} {details['name']!r} not found in namespace {namespace!r}; "
                "check the name, --kind and -n"
            )
        # A plain "404 page not found" (or a Status without a name): the API itself is missing.
        if group in INSTALL_HINTS:
            return f"the cluster has no {what} API (CRD missing); {INSTALL_HINTS[group]}"
        return f"the cluster has no {what} API; check the apiVersion"
    denial = webhook_denial(exc)
    if denial:  # a webhook's 403 is its verdict on the object, not RBAC's on the user
        return f"{verb} {what} refused: {' '.join(denial.split())[:600]}"
    if exc.status == 403:
        where = f"in namespace {namespace!r}" if namespace else "cluster-wide"
        return f"forbidden: cannot {verb} {what} {where}; {RBAC_HINT}"
    if exc.status == 401:
        return "unauthorized: the kubeconfig credentials were rejected; log in again"
    if exc.status == 409:
        name = details.get("name") or ""
        return (
            f"{what} {name!r} already exists in namespace {namespace!r}; delete it first "
            "(kubeddp delete NAME) or pick another --name"
        )
    message = " ".join(str(status.get("message") or exc.reason or "error").split())[:300]
    if not exc.status:  # no HTTP answer at all (the client reports TLS errors so)
        return f"cannot {verb} {what}: {message}; check the server's address and certificate"
    return f"{verb} {what} failed ({exc.status}): {message}"
