"""Progress posted to Kubeflow Trainer's TrainJob status endpoint, from the launch process of
the pod that hosts global rank 0 (KEP-2779: `status.trainerStatus` of the TrainJob).

The contract, read from kubeflow/trainer v2.3.0 (unchanged since v2.2.0):
- pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go: with the controller's
  `TrainJobStatus` feature gate on, every trainer container gets KUBEFLOW_TRAINER_SERVER_URL
  (https://<webhook service>.<operator namespace>.svc:<port>/apis/trainer.kubeflow.org/
  v1alpha1/namespaces/<ns>/trainjobs/<name>/status), KUBEFLOW_TRAINER_SERVER_CA_CERT and
  KUBEFLOW_TRAINER_SERVER_TOKEN: files of a projected volume, the server's CA and a service
  account token for this TrainJob's audience that the kubelet rotates (read at every post).
- pkg/statusserver/server.go and auth.go: POST `{"trainerStatus": {...}}` with
  `Authorization: Bearer <token>`; 200 echoes it, 403 refuses the token, 422 a payload the CRD
  rejects, 404 another path. Its docs ask clients for at most one post every 5 seconds.
- the TrainJob CRD's status.trainerStatus: progressPercentage (0-100), estimatedRemainingSeconds
  (int32 >= 0), metrics (name/value strings), lastUpdatedTime (required).

Rank 0 keeps its progress in a file (worker/status_record.py); a thread here posts it when it
changed, at most every KUBEDDP_TRAINER_STATUS_SECONDS. Training never waits for it: a down or
refusing endpoint is one warning line, then posts less and less often. Without the Trainer
variables there is no thread and no folder; http.client and ssl are imported at the first post.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubeddp.trainer import constants
from kubeddp.trainer import process_contract as status_record
from kubeddp.trainer.common import one_line
from kubeddp.trainer.config import ConfigError
from kubeddp.trainer.deadline import exchange, shut_connection
from kubeddp.trainer.launcher import scratch

# Imported in functions: http.client and ssl (6 modules), only on a TrainJob whose status is posted:
# `kubeddp train --help` imports this module.

# trainjobstatus.go envNameStatusURL / envNameCACert / envNameToken
ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
DEFAULT_SECONDS = 5.0  # Trainer's docs: at most one post every 5 seconds
MIN_SECONDS = 1.0  # the controller's client to the API server is shared (5 qps by default)
POST_TIMEOUT_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 300.0
STOP_WAIT_SECONDS = 3.0  # the last post at the end may hold the pod's exit this long at most
INT32_MAX = 2**31 - 1
FILE_NAME = "progress.json"


class StatusSettingError(ConfigError):
    """KUBEDDP_TRAINER_STATUS_SECONDS is wrong; the message names the value and the fix."""


class PostFailed(Exception):
    """One post did not reach the status: the message is its one-line cause."""


def post_seconds(env: Mapping[str, str]) -> float:
    """Seconds between two posts: KUBEDDP_TRAINER_STATUS_SECONDS, else 5."""
    name = constants.ENV_TRAINER_STATUS_SECONDS
    raw = env.get(name)
    if raw is None or raw == "":
        return DEFAULT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < MIN_SECONDS:
        raise StatusSettingError(
            f"{name}={raw!r} must be a number of seconds >= {MIN_SECONDS:g} (the default is "
            f"{DEFAULT_SECONDS:g}); set one or unset it"
        )
    return seconds


@dataclass(frozen=True)
class StatusEndpoint:
    """Where and how to post, from the variables the controller injects."""

    url: str
    host: str
    port: int
    path: str
    ca_file: str
    token_file: str


def endpoint_from_env(env: Mapping[str, str]) -> StatusEndpoint | None:
    """None without KUBEFLOW_TRAINER_SERVER_URL; ValueError when the variables do not make an
    endpoint (the controller sets all three: another value comes from the manifest)."""
    url = env.get(ENV_URL, "")
    if not url:
        return None
    missing = [name for name in (ENV_CA_CERT, ENV_TOKEN) if not env.get(name)]
    if missing:
        raise ValueError(f"{ENV_URL} is set but {' and '.join(missing)} not")
    parts = urlsplit(url)
    try:
        port = parts.port or 443
    except ValueError:
        port = 0
    if parts.scheme != "https" or not parts.hostname or not port:
        raise ValueError(f"{ENV_URL}={url!r} is not an https://HOST[:PORT]/PATH URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return StatusEndpoint(url, parts.hostname, port, path, env[ENV_CA_CERT], env[ENV_TOKEN])


def _metric_list(record: Mapping[str, Any]) -> list[dict[str, str]]:
    """kubeddp's metrics first, then the program's own (a name kubeddp filled is kubeddp's;
    a script may give its `eval_loss`), each checked against the CRD's limits: one that does
    not fit is left out, not the post."""
    pairs = [(n, record[n]) for n in status_record.STANDARD_NAMES if record.get(n) is not None]
    extra = record.get("metrics")
    if isinstance(extra, dict):
        filled = {name for name, _ in pairs}
        pairs += [(k, v) for k, v in extra.items() if k not in filled]
    found = []
    for name, value in pairs:
        try:
            found.append(
                {"name": status_record.check_name(name), "value": status_record.format_value(value)}
            )
        except ValueError:
            continue
    return found[: status_record.METRICS_MAX]


def trainer_status(record: Mapping[str, Any]) -> dict[str, Any]:
    """The request body for rank 0's `record` (status_feed's file)."""
    status: dict[str, Any] = {}
    step, total = record.get("step"), record.get("total_steps")
    if isinstance(step, int) and isinstance(total, int) and total > 0:
        status["progressPercentage"] = max(0, min(100, step * 100 // total))
    eta = record.get("eta_seconds")
    if isinstance(eta, (int, float)) and math.isfinite(eta):
        status["estimatedRemainingSeconds"] = max(0, min(INT32_MAX, round(eta)))
    metrics = _metric_list(record)
    if metrics:
        status["metrics"] = metrics
    observed = float(record.get("observed_at") or 0.0)
    when = datetime.fromtimestamp(observed, timezone.utc)
    status["lastUpdatedTime"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")  # RFC 3339, as metav1.Time
    return {"trainerStatus": status}


def _refusal(status: int, body: bytes) -> str:
    """`HTTP 403: Forbidden`: the code and the message of the server's metav1.Status."""
    try:
        message = json.loads(body).get("message", "")
    except (ValueError, AttributeError):
        message = body.decode(errors="replace").strip()
    message = " ".join(str(message).split())[:200]
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


def post(endpoint: StatusEndpoint, body: dict[str, Any], timeout: float) -> None:
    """POST `body` with the token as it is now and the CA file; PostFailed says why not."""
    import http.client
    import ssl

    try:
        token = Path(endpoint.token_file).read_text().strip()
        context = ssl.create_default_context(cafile=endpoint.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise PostFailed(one_line(exc)) from None
    if not token:
        raise PostFailed(f"the token file {endpoint.token_file} is empty")
    data = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection = http.client.HTTPSConnection(
        endpoint.host, endpoint.port, context=context, timeout=timeout
    )
    try:  # `timeout` bounds each read and the whole post (a drip-fed answer: deadline.py)
        with exchange(timeout, "the post", shut_connection(connection)):
            connection.request("POST", endpoint.path, body=data, headers=headers)
            answer = connection.getresponse()
            reply = answer.read(4096)
    except (OSError, http.client.HTTPException) as exc:
        raise PostFailed(one_line(exc)) from None
    finally:
        connection.close()
    if answer.status != 200:
        raise PostFailed(_refusal(answer.status, reply))


Post = Callable[[StatusEndpoint, dict[str, Any], float], None]


class StatusPoster:
    """A daemon thread that posts rank 0's newest record when it changed."""

    def __init__(
        self,
        endpoint: StatusEndpoint,
        directory: Path,
        every: float,
        log: Callable[[str], None],
        send: Post = post,
    ) -> None:
        self.endpoint, self.directory, self.every = endpoint, directory, every
        self.record_path = directory / FILE_NAME
        self.log, self.send = log, send
        self.posted = 0  # successful posts
        self.failures = 0  # in a row; the back-off grows with them
        self._warned = False
        self._posted_at: object = None  # observed_at of the last record posted
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kubeddp-trainjob-status")
        self.thread.daemon = True  # never holds the process: stop() waits a bounded time

    def _run(self) -> None:
        delay = self.every
        while not self._stopping.wait(delay):
            delay = self.post_latest()
        if not self.failures:  # the run's last record; not while the endpoint fails
            self.post_latest()

    def post_latest(self) -> float:
        """Post the newest record if it is new; the seconds until the next try."""
        record = status_record.read_snapshot(self.record_path)
        if record is None or record.get("observed_at") == self._posted_at:
            return self.every
        try:
            self.send(self.endpoint, trainer_status(record), POST_TIMEOUT_SECONDS)
        except PostFailed as exc:
            self.failures += 1
            if not self._warned:
                self._warned = True
                self.log(
                    f"[kubeddp] warning: TrainJob progress not posted to {self.endpoint.url}: "
                    f"{exc}; training goes on, later posts are tried less often and not logged"
                )
            return min(self.every * 2**self.failures, MAX_BACKOFF_SECONDS)
        self.failures = 0
        self.posted += 1
        self._posted_at = record.get("observed_at")
        return self.every

    def stop(self) -> None:
        """Post the last record (unless the endpoint is failing) and end the thread."""
        self._stopping.set()
        self.thread.join(STOP_WAIT_SECONDS)
        os.environ.pop(status_record.ENV_STATUS_FILE, None)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_for_launch(env: Mapping[str, str], log: Callable[[str], None]) -> StatusPoster | None:
    """The poster, when the controller offers the endpoint (None otherwise); exports
    KUBEDDP_STATUS_FILE for the workers (torchrun passes os.environ on). A broken endpoint
    setting is one warning: the status is never worth the run. Settings: check_env first."""
    try:
        endpoint = endpoint_from_env(env)
    except ValueError as exc:
        log(f"[kubeddp] warning: TrainJob progress off: {exc}")
        return None
    if endpoint is None:
        return None
    directory = scratch.owned_dir(status_record.STATUS_DIR_PREFIX)
    poster = StatusPoster(endpoint, directory, post_seconds(env), log)
    os.environ[status_record.ENV_STATUS_FILE] = str(poster.record_path)
    poster.thread.start()
    return poster


def check_env(env: Mapping[str, str]) -> None:
    """Refuse a bad KUBEDDP_TRAINER_STATUS_SECONDS before anything starts (StatusSettingError)."""
    post_seconds(env)
