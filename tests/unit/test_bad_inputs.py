"""Every row of the bad-input table (tests/helpers/bad_inputs.py) through the real CLI entry,
in process: the documented exit code, exactly one line on stderr, no traceback, and for names
that must never reach the cluster, no request at all at the stand-in API server.

Launch rows must fail before anything starts; should one be accepted by mistake, the guard
below turns the start of training into a failure of that row instead of a run inside pytest.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeddp.tools.cli.main import main
from kubeddp.trainer.launcher import pod
from tests.helpers import fake_api
from tests.helpers.bad_inputs import (
    ANSWER_MISBEHAVIOURS,
    API_COMMANDS,
    TRANSPORT_ROWS,
    Row,
    all_rows,
    error_lines,
)

pytestmark = pytest.mark.timeout(60)
ROWS = [row for row in all_rows() if not row.training]  # training runs: as processes only
# What the launcher reads: none of this machine's (or CI's) values may leak into a row.
LAUNCH_ENV_PREFIXES = ("PET_", "MASTER_", "TORCHELASTIC_", "KUBEDDP_", "GROUP_", "LOCAL_")
LAUNCH_ENV_NAMES = ("RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX", "KUBECONFIG",
                    "KUBERNETES_SERVICE_HOST")  # fmt: skip


def _never_started(*args, **kwargs):
    raise AssertionError("a bad input was accepted: training would start")


@contextlib.contextmanager
def _api(row: Row, tmp_path: Path) -> Iterator[tuple[list[str], fake_api.FakeApiServer | None]]:
    """The options that point a row at a stand-in API server (if it needs one)."""
    if row.api is None:
        yield [], None
        return
    with fake_api.running() as server:
        server.misbehaviour = None if row.api == "ok" else row.api
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", server.url)
        yield ["--kubeconfig", str(kubeconfig), "--request-timeout", "1"], server


def run_row(row: Row, tmp_path: Path, monkeypatch, capsys) -> tuple[int, str, str, list]:
    for name in list(os.environ):
        if name.startswith(LAUNCH_ENV_PREFIXES) or name in LAUNCH_ENV_NAMES:
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config of this machine
    monkeypatch.setenv("KUBEDDP_DRY_RUN_GPUS", "0")
    for name, value in row.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(pod, "run_agent", _never_started)
    monkeypatch.setattr(pod, "start_for_launch", _never_started)
    write_files(row, tmp_path)
    if row.in_tmp:
        monkeypatch.chdir(tmp_path)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in row.argv]
    with _api(row, tmp_path) as (cluster_options, server), _stdout(row, monkeypatch):
        if cluster_options and "--kubeconfig" not in argv and "--" not in argv:
            argv += cluster_options
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
        requests = list(server.requests) if server else []
    out, err = capsys.readouterr()
    for name in row.must_not_exist:
        assert not (tmp_path / name).exists(), f"{row.id}: the user's code ran in the launcher"
    return code, out, err, requests


def write_files(row: Row, tmp_path: Path) -> None:
    for name, content in row.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    for name in row.fifos:
        os.mkfifo(tmp_path / name)


@contextlib.contextmanager
def _stdout(row: Row, monkeypatch) -> Iterator[None]:
    """A real stdout that cannot be written: /dev/full, none (closed), a pipe with no reader."""
    if row.stdout is None:
        yield
        return
    if row.stdout == "closed":
        monkeypatch.setattr(sys, "stdout", None)
        yield
        return
    if row.stdout == "full":
        stream = open("/dev/full", "w")  # noqa: SIM115 - closed below
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)
        stream = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        yield
    finally:
        monkeypatch.undo()  # sys.stdout back before the stream goes
        with contextlib.suppress(OSError):
            stream.close()


def check_row(row: Row, code: int, out: str, err: str, requests: list) -> None:
    assert "Traceback" not in out + err, err
    lines = error_lines(row, err)
    assert code == row.code, f"{row.id}: exit {code}, want {row.code}\n{err}"
    assert len(lines) == 1, f"{row.id}: {len(lines)} lines on stderr:\n{err}"
    for word in row.mentions:
        assert word in lines[0], f"{row.id}: {word!r} not in {lines[0]!r}"
    if row.api_untouched:
        assert requests == [], f"{row.id}: the API server received {requests}"


def test_the_table_is_large() -> None:
    assert len(ROWS) > 300, len(ROWS)


def test_each_misbehaviour_meets_a_command_and_each_command_a_misbehaviour() -> None:
    """A new misbehaviour of tests/helpers/fake_api.py (or a new cluster command) needs its row
    in tests/helpers/bad_inputs.TRANSPORT_ROWS."""
    assert sorted([*TRANSPORT_ROWS, *ANSWER_MISBEHAVIOURS]) == sorted(fake_api.MISBEHAVIOURS)
    assert sorted(set(TRANSPORT_ROWS.values())) == sorted(API_COMMANDS)


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_bad_input(row: Row, tmp_path: Path, monkeypatch, capsys) -> None:
    check_row(row, *run_row(row, tmp_path, monkeypatch, capsys))
