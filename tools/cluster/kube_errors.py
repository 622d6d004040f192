"""The errors of the cluster commands, shared by the client (tools/cluster/kube.py) and both of its
transports (tools/cluster/kube_client.py, tools/cluster/kubectl_proxy.py)."""

from __future__ import annotations

from kubeddp.trainer import exit_codes


class KubeError(RuntimeError):
    """A cluster operation failed; the message is one line with the fix. `status`: the API
    server's HTTP status when it answered with an error (404: the object or its API is not
    there), else None."""

    exit_code = exit_codes.CLUSTER_ERROR

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeInputError(KubeError):
    """What the user asked for cannot be sent (a bad name, a kind kubeddp does not send), or
    nothing to send it with (neither kubectl nor the Kubernetes client)."""

    exit_code = exit_codes.BAD_INPUT


class AdmissionRefused(KubeError):
    """An admission webhook refused the object; `denial` is the API server's message as it
    came ("admission webhook "NAME" denied the request: ...")."""

    def __init__(self, line: str, denial: str, status: int | None = None) -> None:
        super().__init__(line, status)
        self.denial = denial


class HttpStatusError(Exception):
    """The API server answered with an error status: what `kube.explain` reads (status, reason
    and the body, so both transports are explained alike)."""

    def __init__(self, status: int, reason: str, body: str | bytes | None) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason = status, reason
        self.body = body.decode(errors="replace") if isinstance(body, bytes) else body


class Unreachable(Exception):
    """No answer from the API server. `how`: "connect-timeout", "timeout", "protocol" (a
    connection without a valid HTTP answer) or "refused" (anything else); `name` says why."""

    def __init__(self, how: str, name: str) -> None:
        super().__init__(f"{how}: {name}")
        self.how, self.name = how, name


class StreamBroken(OSError):
    """A followed log stream ended with an error; the message names the cause."""
