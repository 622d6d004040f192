"""Unit tests run in one process (or a few, with pytest-xdist): a test that runs `kubeddp
launch` in-process changes the process's SIGTERM/SIGINT handlers (trainer/launcher/
end_signals.py ignores them once launch's exit code is decided). Each test gets them back as
they were, so a later test's child processes do not inherit an ignored signal. The `api` fixture
is the fake API server with KUBECONFIG naming it (a module may define its own)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from kubeddp.trainer.launcher import end_signals
from tests.helpers import fake_api


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    handlers = {sig: signal.getsignal(sig) for sig in end_signals.HANDLED}
    ends_with_launch = end_signals.PROCESS_ENDS_WITH_LAUNCH
    yield
    end_signals.PROCESS_ENDS_WITH_LAUNCH = ends_with_launch
    for sig, handler in handlers.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@pytest.fixture
def api(tmp_path, monkeypatch) -> Iterator[fake_api.FakeApiServer]:
    with fake_api.running() as server:
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", server.url)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        yield server
