"""A kubeddp.client.Client against the fake API server (tests/helpers/fake_api.py), through
either transport: "client" (the official kubernetes client) or "kubectl" (a real `kubectl
proxy`, the pinned kubectl of tests/helpers/helm_cli.py, with the client made unimportable in
this process). Both serve HTTPS with a certificate made for the test: kubectl sends a bearer
token only over TLS."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeddp.client import Client
from tests.helpers import fake_api, helm_cli

TRANSPORTS = ("client", "kubectl")


@contextlib.contextmanager
def fake_cluster(
    transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **client_options: object
) -> Iterator[tuple[fake_api.FakeApiServer, Client]]:
    """The fake API server and a Client for it; the Client (and its kubectl proxy) is closed
    at the end, whatever happened."""
    if transport == "kubectl":
        kubectl = helm_cli.require(helm_cli.KUBECTL, "kubectl")
        monkeypatch.setenv("KUBEDDP_KUBECTL", str(kubectl))
        monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes: ImportError
    with fake_api.running(tmp_path) as api:
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", api.url, api.ca_pem)
        client = Client(kubeconfig=str(kubeconfig), say=lambda line: None, **client_options)
        try:
            yield api, client
        finally:
            client.close()
