"""Talk to the Kubernetes API with the official client: connect, create, read, delete, logs.

Every API failure becomes a `KubeError` whose one-line message says what to do: install the
missing operator (with the exact command), ask for RBAC (k8s/rbac.yaml), fix the kubeconfig.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubeddp.tools.kinds import KINDS
from kubeddp.tools.resources import COMPANION_RESOURCES, POD, POD_MONITOR, Resource

INSTALL_HINTS = {  # by API group: what to install when its API is missing
    **{kind.resource.group: kind.install_hint for kind in KINDS.values() if kind.install_hint},
    POD_MONITOR.group: "install the Prometheus Operator (kube-prometheus-stack), or render "
    "without --podmonitor",
}
RBAC_HINT = "ask an admin to apply k8s/rbac.yaml (Role kubeddp-submitter) and bind it to you"
IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubeError(RuntimeError):
    """A cluster operation failed; the message is one line with the fix."""


RESOURCES = {
    resource.key: resource
    for resource in (*COMPANION_RESOURCES, *(kind.resource for kind in KINDS.values()))
}


def resource_for(doc: dict) -> Resource:
    key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    if key not in RESOURCES:
        known = ", ".join(sorted(r.kind for r in RESOURCES.values()))
        raise KubeError(f"cannot submit {key}: kubeddp sends only {known}; use kubectl for others")
    return RESOURCES[key]


class Cluster:
    """An API client plus the namespace to use; all calls return plain JSON dicts."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        request_timeout: float = 30.0,
    ) -> None:
        from kubernetes import client, config

        self.request_timeout = request_timeout
        path = (
            kubeconfig
            or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
            or str(Path.home() / ".kube" / "config")
        )
        context_namespace = None
        configuration = client.Configuration()
        configuration.retries = 1  # fail fast on an unreachable server (urllib3 default: 3)
        if Path(path).is_file():
            try:
                config.load_kube_config(path, context, client_configuration=configuration)
                self.api = client.ApiClient(configuration)
                contexts, active = config.list_kube_config_contexts(config_file=path)
            except (config.ConfigException, ValueError, OSError) as exc:
                raise KubeError(
                    f"kubeconfig {path}: {exc}; fix it or pass --kubeconfig/--context"
                ) from None
            chosen = next((c for c in contexts if c["name"] == context), active) or {}
            context_namespace = (chosen.get("context") or {}).get("namespace")
        elif kubeconfig or context:
            raise KubeError(f"no kubeconfig at {path}; pass --kubeconfig PATH or set KUBECONFIG")
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                raise KubeError(
                    f"no Kubernetes credentials: no kubeconfig at {path} and not in a "
                    "pod; set KUBECONFIG or pass --kubeconfig PATH"
                ) from None
            self.api = client.ApiClient(configuration)
            ns_file = Path(IN_CLUSTER_NAMESPACE_FILE)
            context_namespace = ns_file.read_text().strip() if ns_file.is_file() else None
        self.namespace = namespace or context_namespace or "default"

    def request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        what: str = "",
    ) -> Any:
        """One REST call; JSON in, JSON out, errors explained."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            response = self.api.call_api(
                path,
                method,
                query_params=query or [],
                body=body,
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            raise KubeError(explain(exc, method, path, what)) from None
        except HTTPError as exc:
            host = self.api.configuration.host
            raise KubeError(
                f"cannot reach the API server at {host} ({type(exc).__name__}); "
                "check --context/--kubeconfig and that the cluster is up"
            ) from None
        response = response[0] if isinstance(response, tuple) else response
        data = response.data
        if path.endswith("/log"):
            return data.decode(errors="replace")
        return json.loads(data) if data else {}

    def stream(self, path: str, query: list[tuple[str, Any]]) -> Any:
        """A streaming GET (logs --follow): returns the urllib3 response."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.api.call_api(
                path,
                "GET",
                query_params=query,
                auth_settings=["BearerToken"],
                _preload_content=False,
            )
        except ApiException as exc:
            raise KubeError(explain(exc, "GET", path, "pods/log")) from None
        return response[0] if isinstance(response, tuple) else response

    def create(self, doc: dict, dry_run: bool = False) -> dict:
        resource = resource_for(doc)
        namespace = (doc.get("metadata") or {}).get("namespace") or self.namespace
        query = [("dryRun", "All")] if dry_run else []
        return self.request(
            "POST", resource.collection_path(namespace), query, doc, resource.full_name
        )

    def get(self, resource: Resource, name: str) -> dict:
        return self.request(
            "GET", f"{resource.collection_path(self.namespace)}/{name}", what=resource.full_name
        )

    def delete(self, resource: Resource, name: str) -> dict:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        return self.request(
            "DELETE",
            f"{resource.collection_path(self.namespace)}/{name}",
            body=body,
            what=resource.full_name,
        )

    def list_pods(self, selector: str) -> list[dict]:
        data = self.request(
            "GET", POD.collection_path(self.namespace), [("labelSelector", selector)], what="pods"
        )
        return sorted(data.get("items") or [], key=lambda p: p["metadata"]["name"])

    def pod_log(self, pod: str, container: str, tail_lines: int | None = None) -> str:
        query: list[tuple[str, Any]] = [("container", container)]
        if tail_lines is not None:
            query.append(("tailLines", tail_lines))
        path = f"{POD.collection_path(self.namespace)}/{pod}/log"
        return self.request("GET", path, query, what="pods/log")

    def crd_schemas(self, keys: list[str]) -> dict[str, dict]:
        """openAPIV3Schema of the installed CRDs (served version) keyed by apiVersion/kind."""
        out = {}
        for key in keys:
            if key not in RESOURCES:
                continue
            crd_name = RESOURCES[key].full_name  # a CRD is named plural.group
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}"
            crd = self.request("GET", path, what="customresourcedefinitions")
            version = key.split("/")[-2]
            for served in crd.get("spec", {}).get("versions", []):
                if served.get("name") == version and served.get("served"):
                    out[key] = served["schema"]["openAPIV3Schema"]
            if key not in out:
                group = crd_name.split(".", 1)[1]
                raise KubeError(f"CRD {crd_name} does not serve {version}; {INSTALL_HINTS[group]}")
        return out


def _status_body(exc: Any) -> dict:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}


def _group_of(path: str) -> str:
    parts = path.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "apis" else ""


def explain(exc: Any, method: str, path: str, what: str) -> str:
    """An ApiException -> one line with the fix."""
    status = _status_body(exc)
    details = status.get("details") or {}
    verb = {"POST": "create", "GET": "get", "DELETE": "delete"}.get(method, method.lower())
    parts = path.split("/")
    namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts else ""
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
    message = status.get("message") or (exc.reason or "error")
    return f"{verb} {what} failed ({exc.status}): {message}"
