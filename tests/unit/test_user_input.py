"""The pure checks behind issue 24's rows: hosts, PET_RDZV_CONF, a program's module found
without running it, kubeddp.api's arguments, metrics files still being written, and the
answer checks of the Kubernetes client."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeddp import api
from kubeddp.tools.cluster.kube import Expected, KubeError
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.resources import POD
from kubeddp.trainer.launcher.program_options import ProgramError, program_from_options
from kubeddp.trainer.launcher.user_input import host_problem, rdzv_conf_problem
from kubeddp.trainer.launcher.worker_metrics import UserMetricsCollector, WorkerMetricsCollector
from kubeddp.trainer.process_contract import WORKER_METRICS_SUFFIX

GOOD_HOSTS = ("localhost", "demo-master-0", "tj-node-0-0.tj", "10.0.0.1", "fd00::1", "[fd00::1]",
              "a_b.example.com", "node0.")  # fmt: skip
BAD_HOSTS = ("", "h:1234", "127.0.0.1:1234", "a b", "http://h", "a" * 254, "-x", "x..y", "é.com")


@pytest.mark.parametrize("host", GOOD_HOSTS)
def test_hosts_that_are_hosts(host: str) -> None:
    assert host_problem(host) is None


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_hosts_that_are_not(host: str) -> None:
    assert host_problem(host)


@pytest.mark.parametrize(
    ("conf", "bad"),
    [("", False), ("join_timeout=900", False), ("join_timeout=900,is_host=true", False),
     ("garbage", True), ("=1", True), ("a=", True), ("a=1,,b=2", True),
     ("join_timeout=soon", True), ("read_timeout=-1", True), ("keep_alive_interval=1.5", True)],
)  # fmt: skip
def test_rdzv_conf(conf: str, bad: bool) -> None:
    assert bool(rdzv_conf_problem(conf)) is bad


def test_a_module_is_found_without_running_any_of_it(tmp_path: Path, monkeypatch) -> None:
    ran = "import pathlib; pathlib.Path(__file__).with_name('RAN').touch(); raise SystemExit(3)\n"
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/train.py", "train.py"):
        (tmp_path / name).write_text(ran)
    (tmp_path / "pkg" / "sub" / "__main__.py").write_text(ran)
    monkeypatch.chdir(tmp_path)
    for name in ("pkg.sub.train", "pkg.sub", "train"):
        assert program_from_options(None, name, []).target == name
    for name, why in (("pkg", "__main__"), ("train.py", "--script"), ("pkg.nope", "pkg.nope"),
                      ("train.x", "not a package"), ("1x", "not a module name")):  # fmt: skip
        with pytest.raises(ProgramError, match=why):
            program_from_options(None, name, [])
    assert not list(tmp_path.rglob("RAN")), "the user's code ran in the launcher"


def test_report_step_never_ends_the_program(monkeypatch, capsys) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(api, "_warned", False)
    monkeypatch.setattr(api, "_REPORTER", api._StepReporter())
    api.report_step(-5, -3)
    api.report_step("x", 1.5, loss="high", tokens=-1)
    api.report_step(True, 1)
    api.report_step(1, 4, loss=float("nan"))  # a diverging loss is reported, not refused
    api.report_step(2, 4.0, loss=1, tokens=8)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report_step ignored: step=-5 is negative" in err[0], err


def test_the_checked_arguments() -> None:
    assert api._checked(3, 4.0, 1, None) == (3, 4, 1.0, None)
    for bad in ((-1, 1, None, None), (1, -1, None, None), (1.5, 1, None, None),
                (1, 1, "x", None), (1, 1, None, -2), (None, 1, None, None)):  # fmt: skip
        with pytest.raises(ValueError):
            api._checked(*bad)


def test_metrics_files_still_being_written_are_skipped(tmp_path: Path) -> None:
    """A user program's prometheus_client file being created or cut short, and a kubeddp
    worker file that is not (yet) a record, cost that scrape nothing but themselves."""
    (tmp_path / "counter_1.db").write_bytes(b"")  # created, not yet grown
    (tmp_path / "counter_2.db").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00\x01")  # cut short
    (tmp_path / "gauge_mostrecent_3.db").write_bytes(b"\x00\x00")
    (tmp_path / f"worker-0-1-ab{WORKER_METRICS_SUFFIX}").write_text('{"rank": 0')  # not JSON
    (tmp_path / f"worker-1-1-ab{WORKER_METRICS_SUFFIX}").write_text('{"version": 99}')
    assert list(UserMetricsCollector(str(tmp_path)).collect()) == []
    assert list(WorkerMetricsCollector(str(tmp_path)).collect()) == []


PYTORCHJOB = KINDS["pytorchjob"].resource
JOB = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "demo"}}
A_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "demo"}}


@pytest.mark.parametrize(
    ("expected", "answer"),
    [(Expected(PYTORCHJOB, "demo"), {}),
     (Expected(PYTORCHJOB, "demo"), A_POD),
     (Expected(PYTORCHJOB, "demo"), {**JOB, "metadata": {"name": "other"}}),
     (Expected(POD, listed=True), {"apiVersion": "v1", "kind": "PodList"}),
     (Expected(POD, listed=True), {"apiVersion": "v1", "kind": "Pod", "items": []}),
     (Expected(PYTORCHJOB, "demo", deleted=True), {"kind": "Status", "status": "Failure"}),
     (Expected(PYTORCHJOB, "demo", deleted=True), {})],
)  # fmt: skip
def test_answers_that_are_not_what_was_asked_for(expected: Expected, answer: dict) -> None:
    with pytest.raises(KubeError, match="nothing is believed"):
        expected.check(answer, "GET", "/x", "http://h")


@pytest.mark.parametrize(
    ("expected", "answer"),
    [(Expected(PYTORCHJOB, "demo"), JOB),
     (Expected(POD, listed=True), {"apiVersion": "v1", "kind": "PodList", "items": []}),
     (Expected(PYTORCHJOB, "demo", deleted=True), {"kind": "Status", "status": "Success"}),
     (Expected(PYTORCHJOB, "demo", deleted=True), JOB)],
)  # fmt: skip
def test_answers_that_are(expected: Expected, answer: dict) -> None:
    expected.check(answer, "GET", "/x", "http://h")
