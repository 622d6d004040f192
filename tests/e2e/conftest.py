"""Fixtures for the image tests: a Docker engine and the CPU image, made once per session.

Outside CI the tests skip when not root (dockerd needs it); in CI (CI=true) they fail instead,
so a broken set-up can never pass as "skipped".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import dockerenv  # noqa: E402

_times = dockerenv.StepTimes()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def cpu_image() -> str:
    """Tag of the kubeddp CPU image built from this checkout (offline, legacy builder)."""
    if os.geteuid() != 0:
        why = "the image tests need root to install and start dockerd: run them with sudo"
        if _in_ci():
            pytest.fail(why)
        pytest.skip(why)
    try:
        return dockerenv.prepare(_times)
    except dockerenv.DockerSetupError as exc:
        pytest.fail(f"docker set-up failed: {exc}")


@pytest.fixture
def docker(cpu_image: str, request: pytest.FixtureRequest) -> Iterator[dockerenv.DockerRun]:
    """Runs containers and makes networks for one test; removes all of them afterwards."""
    run = dockerenv.DockerRun(image=cpu_image, prefix=f"e2e{os.getpid() % 10000}")
    try:
        yield run
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            run.dump_logs()
        run.cleanup()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's own type
    if _times.seconds:
        terminalreporter.write_line(f"docker image set-up: {_times.summary()}")
