"""`kubeddp logs --follow` follows the job, not a fixed set of pods: against the fake API server
(tests/helpers/fake_api.py), whose pod logs are streamed as they are written, pods are replaced
mid-follow (recreated under the same name with a new uid, a new pod, a container restarted in
place); each joins with its prefix, each ended one stops, and the follow ends when the job
does. Through both transports (the kubernetes client, kubectl proxy)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from kubeddp.tools.cluster import job_logs
from tests.helpers import fake_api
from tests.helpers.api_client import TRANSPORTS, fake_cluster
from tests.helpers.fake_api import Streamed

pytestmark = pytest.mark.timeout(120)
NS = fake_api.NAMESPACE
JOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
WAIT = 30  # seconds any one step below may take on a loaded machine


def job(state: str | None = None, master: bool = False) -> dict:
    conditions = [{"type": state, "status": "True"}] if state else []
    replicas = {"Worker": {"replicas": 2}} | ({"Master": {"replicas": 1}} if master else {})
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "demo"},
        "spec": {"pytorchReplicaSpecs": replicas}, "status": {"conditions": conditions},
    }  # fmt: skip


def pod(name: str, uid: str, restarts: int = 0, state: str = "running") -> dict:
    phase = {"running": "Running", "terminated": "Succeeded"}.get(state, "Pending")
    container = {"name": "pytorch", "restartCount": restarts, "state": {state: {}}}
    return {"metadata": {"name": name, "uid": uid},
            "status": {"phase": phase, "containerStatuses": [container]}}  # fmt: skip


def pod_list(*pods: dict) -> dict:
    return {"kind": "PodList", "apiVersion": "v1", "items": list(pods)}


class Logs:
    """Each log request of a pod gets a new Streamed answer, kept here in order."""

    def __init__(self, api: fake_api.FakeApiServer) -> None:
        self.api, self.streams, self.lock = api, {}, threading.Lock()

    def serve(self, *names: str) -> None:
        for name in names:
            self.api.route("GET", f"{PODS}/{name}/log", 200, self._new(name))

    def _new(self, name: str) -> Callable[[], Streamed]:
        def make() -> Streamed:
            with self.lock:
                stream = Streamed()
                self.streams.setdefault(name, []).append(stream)
                return stream

        return make

    def opened(self, name: str, count: int) -> Streamed:
        """The pod's `count`-th stream, once kubeddp has opened it."""
        until(lambda: len(self.streams.get(name, [])) >= count, f"stream {count} of {name}")
        return self.streams[name][count - 1]


def until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


class Following:
    """client.logs(..., follow=True) in a thread, its lines collected as they come."""

    def __init__(self, lines_of: Callable[[], object]) -> None:
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(lines_of,), daemon=True)
        self.thread.start()

    def _run(self, lines_of: Callable[[], object]) -> None:
        try:
            for line in lines_of():  # type: ignore[attr-defined]
                self.lines.append(str(line))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            self.error = exc

    def saw(self, line: str) -> None:
        until(lambda: line in self.lines or self.error is not None, f"the line {line!r}")
        assert self.error is None, self.error

    def ends(self) -> None:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the follow did not end with the job"
        assert self.error is None, self.error


@pytest.fixture(autouse=True)
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_logs, "POLL_SECONDS", 0.1)
    monkeypatch.setattr(job_logs, "END_GRACE_SECONDS", 1.0)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_follow_takes_pods_as_they_come_and_go_and_ends_with_the_job(
    transport: str, tmp_path, monkeypatch
) -> None:
    with fake_cluster(transport, tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{JOBS}/demo", 200, job())
        api.route("GET", PODS, 200, pod_list(pod("demo-worker-0", "a"), pod("demo-worker-1", "b")))
        logs = Logs(api)
        logs.serve("demo-worker-0", "demo-worker-1", "demo-worker-2")
        following = Following(lambda: client.logs("demo", follow=True, tail=5))
        logs.opened("demo-worker-0", 1).put("step 1\n")
        logs.opened("demo-worker-1", 1).put("step 1 on w1\n")
        following.saw("[demo-worker-1] step 1 on w1")
        # worker-1 is preempted and recreated under its name (a new uid), and worker-2 joins
        logs.streams["demo-worker-1"][0].put("[kubeddp] preempted\n")
        logs.streams["demo-worker-1"][0].end()
        following.saw("[demo-worker-1] [kubeddp] preempted")
        api.route("GET", PODS, 200, pod_list(pod("demo-worker-0", "a"), pod("demo-worker-1", "c"),
                                             pod("demo-worker-2", "d")))  # fmt: skip
        logs.opened("demo-worker-1", 2).put("resumed from step 1\n")
        logs.opened("demo-worker-2", 1).put("hello from 2\n")
        following.saw("[demo-worker-1] resumed from step 1")
        following.saw("[demo-worker-2] hello from 2")
        # worker-0's container restarts in place (same uid, one more restart)
        logs.streams["demo-worker-0"][0].end()
        restarted = pod("demo-worker-0", "a", restarts=1)
        api.route("GET", PODS, 200, pod_list(restarted, pod("demo-worker-1", "c"),
                                             pod("demo-worker-2", "d")))  # fmt: skip
        logs.opened("demo-worker-0", 2).put("restarted\n")
        following.saw("[demo-worker-0] restarted")
        # the job succeeds; its pods end their logs
        api.route("GET", f"{JOBS}/demo", 200, job("Succeeded"))
        for name in ("demo-worker-0", "demo-worker-1", "demo-worker-2"):
            logs.streams[name][-1].put("done\n")
            logs.streams[name][-1].end()
        following.ends()
    assert following.lines == dedupe(following.lines), "a line was shown twice"
    assert sorted(line for line in following.lines if line.endswith(" done")) == [
        f"[demo-worker-{i}] done" for i in range(3)
    ]
    sent = [r for r in api.requests if r["path"].endswith("/log")]
    first = [r for r in sent if r["path"].endswith("demo-worker-0/log")][0]
    assert first["query"] == {"container": "pytorch", "follow": "true", "timestamps": "true",
                              "tailLines": "5"}  # fmt: skip
    joined = [r for r in sent if r["path"].endswith("demo-worker-2/log")][0]
    assert "tailLines" not in joined["query"]  # a pod that joined later: every line is new


def dedupe(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_pod_that_outlives_the_job_is_let_go(transport: str, tmp_path, monkeypatch) -> None:
    """A Worker that still runs after the job Succeeded (its Master decided) does not hold the
    follow: after the grace its stream is closed and the follow ends."""
    with fake_cluster(transport, tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{JOBS}/demo", 200, job())
        api.route("GET", PODS, 200, pod_list(pod("demo-worker-0", "a")))
        logs = Logs(api)
        logs.serve("demo-worker-0")
        following = Following(lambda: client.logs("demo", follow=True))
        logs.opened("demo-worker-0", 1).put("still here\n")
        following.saw("[demo-worker-0] still here")
        api.route("GET", f"{JOBS}/demo", 200, job("Succeeded"))
        following.ends()
        until(logs.streams["demo-worker-0"][0].ended.is_set, "the stream closed by kubeddp")


def test_node_rank_picks_that_pod(tmp_path, monkeypatch) -> None:
    """Node rank 1 of a job with a Master is worker-0 (the Master is node rank 0)."""
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{JOBS}/demo", 200, job("Succeeded", master=True))
        api.route("GET", PODS, 200, pod_list(pod("demo-worker-0", "a", state="terminated")))
        api.route("GET", f"{PODS}/demo-worker-0/log", 200, "the end\n")
        lines = [str(line) for line in client.logs("demo", node_rank=1, follow=True)]
    assert lines == ["[demo-worker-0] the end"]
    listed = [r for r in api.requests if r["path"] == PODS]
    assert {r["query"]["labelSelector"] for r in listed} == {
        "training.kubeflow.org/job-name=demo,"
        "training.kubeflow.org/replica-type=worker,training.kubeflow.org/replica-index=0"
    }


def test_a_stream_cut_while_its_container_runs_is_resumed_without_repeats(
    tmp_path, monkeypatch
) -> None:
    """The kubelet ends a long-open stream now and then: kubeddp asks again from the last
    line's timestamp and skips what it showed."""
    monkeypatch.setattr(job_logs, "RESUME_AFTER_SECONDS", 0.0)
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", f"{JOBS}/demo", 200, job())
        api.route("GET", PODS, 200, pod_list(pod("demo-worker-0", "a")))
        logs = Logs(api)
        logs.serve("demo-worker-0")
        following = Following(lambda: client.logs("demo", follow=True))
        first = logs.opened("demo-worker-0", 1)
        first.put("2026-01-01T00:00:01.5Z one\n2026-01-01T00:00:02Z two\n")
        first.end()  # cut: the container still runs
        following.saw("[demo-worker-0] two")
        second = logs.opened("demo-worker-0", 2)
        second.put("2026-01-01T00:00:01.5Z one\n2026-01-01T00:00:02Z two\n")
        second.put("2026-01-01T00:00:02.25Z three\n")
        following.saw("[demo-worker-0] three")
        api.route("GET", f"{JOBS}/demo", 200, job("Failed"))
        second.end()
        following.ends()
    assert following.lines == [f"[demo-worker-0] {n}" for n in ("one", "two", "three")]
    resumed = [r for r in api.requests if r["path"].endswith("/log")][1]
    assert resumed["query"]["sinceTime"] == "2026-01-01T00:00:02Z"


def test_follow_of_a_job_that_does_not_exist_is_one_line(tmp_path, monkeypatch) -> None:
    from kubeddp.client import KubeddpError

    with (
        fake_cluster("client", tmp_path, monkeypatch) as (_, client),
        pytest.raises(KubeddpError) as err,
    ):
        client.logs("nope", follow=True)
    assert err.value.exit_code == 3 and err.value.command == "logs"
    assert "no job named 'nope'" in str(err.value)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_log_stream_whose_answer_never_begins_ends_at_the_request_timeout(
    transport: str, tmp_path, monkeypatch
) -> None:
    """Only connecting was timed: a server that took the request and never sent its headers
    held `kubeddp logs -f` without a word. Its answer must begin within the request timeout."""
    from kubeddp.tools.cluster.kube_errors import KubeError

    with fake_cluster(transport, tmp_path, monkeypatch, request_timeout=2) as (api, client):
        api.route("GET", f"{PODS}/demo-worker-0/log", 200, lambda: api.release.wait(60))
        with pytest.raises(KubeError, match="did not begin the log within 2s"):
            client.cluster().stream(f"{PODS}/demo-worker-0/log", [("follow", "true")])
        api.release.set()
