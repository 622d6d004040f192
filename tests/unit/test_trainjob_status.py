"""TrainJob progress for Kubeflow Trainer's status endpoint: rank 0's record (status_feed), the
request body against the v2.3.0 CRD's trainerStatus schema, the settings, and posts to a real
HTTPS stand-in of Trainer's status server (tests/helpers/trainer_status_server.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kubeddp.trainer import constants, process_contract
from kubeddp.trainer.config import ConfigError
from kubeddp.trainer.launcher import trainjob_status as ts
from kubeddp.trainer.process_contract import format_value, read_snapshot
from kubeddp.trainer.worker.status_feed import StatusFeed, for_rank
from tests.helpers import trainer_status_server as tss
from tests.helpers.ports import free_port

NS, NAME = "team", "tj"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ts.ENV_URL, ts.ENV_CA_CERT, ts.ENV_TOKEN, process_contract.ENV_STATUS_FILE,
                 constants.ENV_TRAINER_STATUS_SECONDS):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server(tmp_path: Path):
    with tss.running(tmp_path / "tls", {(NS, NAME)}) as running:
        yield running


def endpoint(server: tss.TrainerStatusServer, folder: Path, name: str = NAME) -> ts.StatusEndpoint:
    tss.pod_files(server, folder, NS, name)
    found = ts.endpoint_from_env(tss.pod_env(server, folder, NS, NAME))
    assert found is not None
    return found


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- rank 0's record
def test_the_feed_writes_at_most_once_a_second_and_flushes_the_rest(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "progress.json"
    feed = StatusFeed(path, clock=clock, wall=lambda: 1.7e9 + clock.now)
    feed.update(1, total_steps=10, loss=2.0)
    assert read_snapshot(path)["step"] == 1
    clock.now += 0.5
    feed.update(2, total_steps=10, eval_loss=1.5)
    assert read_snapshot(path)["step"] == 1, "written again within a second"
    clock.now += 0.6
    feed.update(3, total_steps=10, metrics={"accuracy": "0.5"})
    record = read_snapshot(path)
    # a loss or eval loss given once stays; the rate since the first update gives the ETA
    assert (record["step"], record["loss"], record["eval_loss"]) == (3, 2.0, 1.5)
    assert record["eta_seconds"] == pytest.approx(1.1 / 2 * 7)
    assert record["metrics"] == {"accuracy": "0.5"}
    feed.update(4, total_steps=10)
    feed.flush()
    assert read_snapshot(path)["step"] == 4
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file is renamed into place"


def test_only_global_rank_0_under_a_posting_launch_has_a_feed(tmp_path: Path) -> None:
    env = {process_contract.ENV_STATUS_FILE: str(tmp_path / "p.json")}
    assert for_rank(0, env) is not None
    assert for_rank(1, env) is None
    assert for_rank(0, {}) is None
    (tmp_path / "bad.json").write_text("[1, 2")
    assert read_snapshot(tmp_path / "bad.json") is None
    assert read_snapshot(tmp_path / "missing.json") is None


def test_metric_values_are_formatted_as_trainer_keeps_them() -> None:
    assert format_value(3) == "3"
    assert format_value(0.123456789) == "0.123457"
    assert format_value(float("nan")) == "nan"
    assert format_value("ok") == "ok"
    for bad in (True, None, [1], "", "x" * 65):
        with pytest.raises(ValueError):
            format_value(bad)


# ---------------------------------------------------------------- the request body
RECORDS = {
    "built-in trainer": {"step": 40, "total_steps": 80, "epoch": 1, "total_epochs": 4,
                         "loss": 0.25, "eval_loss": 0.31, "eta_seconds": 12.4,
                         "metrics": {}, "observed_at": 1.7e9},
    "script, no total": {"step": 7, "loss": float("inf"), "eta_seconds": None,
                         "metrics": {"accuracy": "0.9"}, "observed_at": 1.7e9},
    "past the end, huge eta": {"step": 90, "total_steps": 80, "eta_seconds": 1e12,
                               "metrics": {}, "observed_at": 1.7e9},
    "too many and too long": {"step": 1, "observed_at": 1.7e9, "metrics": {
        **{f"m{i}": str(i) for i in range(300)}, "x" * 65: "1", "loss": "shadow"}},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(RECORDS))
def test_every_body_fits_the_crds_trainer_status(case: str) -> None:
    body = ts.trainer_status(RECORDS[case])
    assert set(body) == {"trainerStatus"}
    status = body["trainerStatus"]
    assert tss.status_problems(status, tss.trainer_status_schema()) == []
    names = [m["name"] for m in status.get("metrics", [])]
    assert len(names) == len(set(names)) <= 256


def test_percentage_remaining_time_and_metrics_of_the_built_in_trainer() -> None:
    status = ts.trainer_status(RECORDS["built-in trainer"])["trainerStatus"]
    assert status["progressPercentage"] == 50
    assert status["estimatedRemainingSeconds"] == 12
    assert status["lastUpdatedTime"] == "2023-11-14T22:13:20Z"
    assert {m["name"]: m["value"] for m in status["metrics"]} == {
        "step": "40", "total_steps": "80", "epoch": "1", "total_epochs": "4",
        "loss": "0.25", "eval_loss": "0.31",
    }  # fmt: skip
    assert (
        ts.trainer_status(RECORDS["past the end, huge eta"])["trainerStatus"]["progressPercentage"]
        == 100
    )
    script = ts.trainer_status(RECORDS["script, no total"])["trainerStatus"]
    assert "progressPercentage" not in script and "estimatedRemainingSeconds" not in script
    # a name kubeddp filled is never shadowed by a program's metric; one it did not, is the
    # program's (a script's eval_loss)
    shadowing = {**RECORDS["built-in trainer"], "metrics": {"loss": "shadow", "eval_loss": "0"}}
    shown = ts.trainer_status(shadowing)["trainerStatus"]["metrics"]
    assert {"name": "loss", "value": "0.25"} in shown
    assert {"name": "eval_loss", "value": "0.31"} in shown and len(shown) == 6
    scripts = ts.trainer_status(RECORDS["script, no total"] | {"metrics": {"eval_loss": "0.5"}})
    assert {"name": "eval_loss", "value": "0.5"} in scripts["trainerStatus"]["metrics"]


def test_the_stand_in_refuses_what_the_api_server_would() -> None:
    schema = tss.trainer_status_schema()
    good = ts.trainer_status(RECORDS["built-in trainer"])["trainerStatus"]
    assert tss.status_problems({**good, "progressPercentage": 101}, schema)
    assert tss.status_problems({**good, "currentStep": 3}, schema), "Trainer would drop it"
    assert tss.status_problems({k: v for k, v in good.items() if k != "lastUpdatedTime"}, schema)
    assert tss.status_problems({**good, "lastUpdatedTime": "yesterday"}, schema)
    assert tss.status_problems({**good, "metrics": [{"name": "loss", "value": 0.2}]}, schema)


# ---------------------------------------------------------------- settings
def test_post_seconds_default_and_bad_values() -> None:
    assert ts.post_seconds({}) == 5.0
    assert ts.post_seconds({constants.ENV_TRAINER_STATUS_SECONDS: "2.5"}) == 2.5
    for bad in ("0.5", "soon", "nan", "-1", "inf"):
        env = {constants.ENV_TRAINER_STATUS_SECONDS: bad}
        with pytest.raises(ConfigError, match=rf"KUBEDDP_TRAINER_STATUS_SECONDS='{bad}' must"):
            ts.check_env(env)


def test_endpoint_from_the_controllers_variables(tmp_path: Path) -> None:
    assert ts.endpoint_from_env({}) is None
    env = {ts.ENV_URL: "https://svc.kubeflow-system.svc:10443/apis/x/status",
           ts.ENV_CA_CERT: "/ca.crt", ts.ENV_TOKEN: "/token"}  # fmt: skip
    found = ts.endpoint_from_env(env)
    assert found is not None
    assert (found.host, found.port, found.path) == (
        "svc.kubeflow-system.svc",
        10443,
        "/apis/x/status",
    )
    with pytest.raises(ValueError, match="KUBEFLOW_TRAINER_SERVER_TOKEN not"):
        ts.endpoint_from_env({**env, ts.ENV_TOKEN: ""})
    with pytest.raises(ValueError, match="is not an https://"):
        ts.endpoint_from_env({**env, ts.ENV_URL: "http://svc:80/status"})
    with pytest.raises(ValueError, match="is not an https://"):
        ts.endpoint_from_env({**env, ts.ENV_URL: "https://svc:port/status"})


def test_without_the_variables_no_thread_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    before = threading.active_count()
    assert ts.start_for_launch({}, lines.append) is None
    assert threading.active_count() == before and lines == []
    assert process_contract.ENV_STATUS_FILE not in __import__("os").environ
    partial = {ts.ENV_URL: "https://svc:10443/status"}
    assert ts.start_for_launch(partial, lines.append) is None
    assert lines == [
        "[kubeddp] warning: TrainJob progress off: KUBEFLOW_TRAINER_SERVER_URL is set but "
        "KUBEFLOW_TRAINER_SERVER_CA_CERT and KUBEFLOW_TRAINER_SERVER_TOKEN not"
    ]


def test_importing_the_poster_and_the_api_costs_no_ssl_or_http_client() -> None:
    code = (
        "import sys; import kubeddp.api, kubeddp.trainer.launcher.trainjob_status;"
        "print(sorted(m for m in ('ssl', 'http.client') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]", done.stdout


# ---------------------------------------------------------------- posts
def test_a_post_reaches_the_status_and_rereads_a_rotated_token(
    server: tss.TrainerStatusServer, tmp_path: Path
) -> None:
    found = endpoint(server, tmp_path / "pod")
    body = ts.trainer_status(RECORDS["built-in trainer"])
    ts.post(found, body, 5)
    assert server.latest(NS, NAME) == body["trainerStatus"]
    first = server.requests[-1].authorization
    # the kubelet rotates the projected token: the next post sends the new one
    (tmp_path / "pod" / "token").write_text(server.credentials.token(NS, NAME, expires_in=600))
    ts.post(found, body, 5)
    assert server.requests[-1].authorization != first
    assert server.requests[-1].answered == 200


@pytest.mark.parametrize(
    ("breakage", "said"),
    [
        ("another job's token", "HTTP 403: Forbidden"),
        ("an expired token", "HTTP 403: Forbidden"),
        ("another CA", "SSLCertVerificationError"),
        ("an empty token file", "is empty"),
        ("a proxy's 401", "HTTP 401: answered 401"),
    ],
)
def test_a_refused_post_says_why_in_one_line(
    server: tss.TrainerStatusServer, tmp_path: Path, breakage: str, said: str
) -> None:
    found = endpoint(server, tmp_path / "pod")
    token = tmp_path / "pod" / "token"
    if breakage == "another job's token":
        token.write_text(server.credentials.token(NS, "other"))
    elif breakage == "an expired token":
        token.write_text(server.credentials.token(NS, NAME, expires_in=-10))
    elif breakage == "another CA":
        other = tss.Credentials(tmp_path / "other", ("127.0.0.1",))
        (tmp_path / "pod" / "ca.crt").write_bytes(other.ca_file.read_bytes())
    elif breakage == "an empty token file":
        token.write_text("\n")
    else:
        server.answer_with(401)
    with pytest.raises(ts.PostFailed, match=said) as failed:
        ts.post(found, ts.trainer_status(RECORDS["built-in trainer"]), 5)
    assert "\n" not in str(failed.value)
    assert server.statuses(NS, NAME) == []


def test_a_down_or_hanging_endpoint_fails_the_post_within_its_timeout(
    server: tss.TrainerStatusServer, tmp_path: Path
) -> None:
    found = endpoint(server, tmp_path / "pod")
    body = ts.trainer_status(RECORDS["built-in trainer"])
    down = ts.StatusEndpoint(found.url, "127.0.0.1", free_port(), found.path,
                             found.ca_file, found.token_file)  # fmt: skip
    with pytest.raises(ts.PostFailed, match="ConnectionRefusedError"):
        ts.post(down, body, 5)
    server.hang()
    with pytest.raises(ts.PostFailed, match="TimeoutError|timed out|did not end within"):
        ts.post(found, body, 0.3)


def test_a_drip_fed_answer_fails_the_post_at_its_total_deadline_and_says_so(
    server: tss.TrainerStatusServer, tmp_path: Path
) -> None:
    """An endpoint that answers 200 and sends its body a byte at a time: every read is within
    the timeout, so only a deadline for the whole post ends it (the poster's thread once
    froze there, and progress reporting with it, without a word)."""
    lines: list[str] = []
    made = poster(server, tmp_path, lines)
    server.drip()
    write(made, 10, 1.7e9)
    made.send = lambda endpoint, body, timeout: ts.post(endpoint, body, 1.0)
    assert made.post_latest() == 10.0, "failed: the next try backs off"
    assert made.failures == 1 and len(lines) == 1
    assert "TrainJob progress not posted" in lines[0] and "did not end within 1 s" in lines[0]


# ---------------------------------------------------------------- the poster
def poster(server: tss.TrainerStatusServer, tmp_path: Path, lines: list[str]) -> ts.StatusPoster:
    found = endpoint(server, tmp_path / "pod")
    folder = tmp_path / "status"
    folder.mkdir()
    return ts.StatusPoster(found, folder, 5.0, lines.append)


def write(made: ts.StatusPoster, step: int, at: float) -> None:
    record = {**RECORDS["built-in trainer"], "step": step, "observed_at": at}
    made.record_path.write_text(json.dumps(record))


def test_the_poster_posts_new_records_only(server: tss.TrainerStatusServer, tmp_path: Path) -> None:
    lines: list[str] = []
    made = poster(server, tmp_path, lines)
    assert made.post_latest() == 5.0 and server.requests == [], "nothing written yet"
    write(made, 10, 1.7e9)
    made.post_latest()
    made.post_latest()  # the same record: not posted again
    write(made, 20, 1.7e9 + 1)
    made.post_latest()
    assert [s["progressPercentage"] for s in server.statuses(NS, NAME)] == [12, 25]
    assert len(server.requests) == 2 and lines == []


def test_a_failing_endpoint_is_one_line_then_quieter_tries(
    server: tss.TrainerStatusServer, tmp_path: Path
) -> None:
    lines: list[str] = []
    made = poster(server, tmp_path, lines)
    server.answer_with(403)
    delays = []
    for i in range(8):
        write(made, i + 1, 1.7e9 + i)
        delays.append(made.post_latest())
    assert len(server.requests) == 8
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"[kubeddp] warning: TrainJob progress not posted to {made.endpoint.url}"
    )
    assert "HTTP 403" in lines[0]
    assert delays == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0]
    server.answer_with(None)  # the controller is back: posts resume, still no line
    assert made.post_latest() == 5.0
    write(made, 9, 1.7e9 + 9)
    made.post_latest()
    assert len(lines) == 1 and made.failures == 0
    assert server.latest(NS, NAME)["metrics"][0] == {"name": "step", "value": "9"}


def test_stop_posts_the_last_record_unless_the_endpoint_fails(
    server: tss.TrainerStatusServer, tmp_path: Path
) -> None:
    made = poster(server, tmp_path, [])
    made.thread.start()
    write(made, 80, 1.7e9)
    made.stop()
    assert not made.thread.is_alive() and not made.directory.exists()
    assert server.latest(NS, NAME)["progressPercentage"] == 100
    failing = poster(server, tmp_path / "second", [])
    failing.failures = 1  # in back-off: the end does not wait for another refusal
    failing.thread.start()
    write(failing, 40, 1.7e9 + 1)
    before = len(server.requests)
    failing.stop()
    assert len(server.requests) == before


def test_start_for_launch_exports_the_file_and_posts_from_a_thread(
    server: tss.TrainerStatusServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tss.pod_files(server, tmp_path / "pod", NS, NAME)
    env = tss.pod_env(server, tmp_path / "pod", NS, NAME)
    monkeypatch.setattr(ts.scratch, "root", lambda: tmp_path)
    made = ts.start_for_launch({**env, constants.ENV_TRAINER_STATUS_SECONDS: "1"}, print)
    assert made is not None and made.thread.is_alive()
    import os

    feed = for_rank(0)  # what rank 0 of a worker started now would make
    assert feed is not None and os.environ[process_contract.ENV_STATUS_FILE] == str(
        made.record_path
    )
    feed.update(3, total_steps=4, loss=math.pi)
    made.stop()
    assert server.latest(NS, NAME)["progressPercentage"] == 75
    assert process_contract.ENV_STATUS_FILE not in os.environ


def test_report_step_feeds_rank_0s_record_with_a_scripts_metrics(tmp_path: Path) -> None:
    """kubeddp.api.report_step in a worker of a posting launch (no metrics directory): its
    totals and metrics reach the record; a bad metric is one warning and that call is dropped."""
    record = tmp_path / "progress.json"
    code = (
        "from kubeddp import api\n"
        "api.report_step(1, samples=4, loss=0.5, total_steps=10, epoch=0, total_epochs=2,"
        " metrics={'eval_loss': 0.25, 'phase': 'warm-up'})\n"
        "api.report_step(2, samples=4, metrics={'x' * 65: 1})\n"
        "api.report_step(3, samples=4, metrics=['accuracy'])\n"
    )
    env = {**__import__("os").environ, process_contract.ENV_STATUS_FILE: str(record), "RANK": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    warnings = [line for line in done.stderr.splitlines() if "report_step ignored" in line]
    assert len(warnings) == 1 and "must be a string of 1 to 64 characters" in warnings[0], warnings
    written = read_snapshot(record)
    assert written is not None
    assert (written["step"], written["total_steps"], written["total_epochs"]) == (1, 10, 2)
    assert written["metrics"] == {"eval_loss": "0.25", "phase": "warm-up"}
    status = ts.trainer_status(written)["trainerStatus"]
    assert status["progressPercentage"] == 10
    assert {"name": "eval_loss", "value": "0.25"} in status["metrics"]
    assert tss.status_problems(status, tss.trainer_status_schema()) == []
