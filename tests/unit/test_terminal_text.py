"""Pod log text reaches the terminal without control sequences: `kubeddp logs`, `status` (its
health lines and termination messages) and `diagnose` print what a pod wrote, and a pod can
write anything. Hostile bytes through the fake API server: printable text, tabs and newlines
stay; escape sequences (OSC 52 clipboard writes, clear screen, cursor moves, a title) and
other control characters go."""

from __future__ import annotations

import re

import pytest

from kubeddp.tools.cli.main import main
from kubeddp.tools.cluster.terminal_text import printable
from tests.helpers import fake_api
from tests.helpers.api_client import fake_cluster

pytestmark = pytest.mark.timeout(60)
NS = fake_api.NAMESPACE
PODS = f"/api/v1/namespaces/{NS}/pods"
JOB = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/demo"
# What no printed byte may be: C0 controls but tab and newline, DEL, C1 controls, ESC.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
HOSTILE = (
    b"\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07step 1\t| loss 0.5\n"  # OSC 52: the clipboard
    b"\x1b[2J\x1b[Hcleared?\n"  # clear the screen, cursor home
    b"\x1b]0;a new title\x1b\\title set\n"  # OSC with ST
    b"\xc2\x9b31mC1 CSI\r\n"  # CSI as one C1 character; a carriage return
    b"\x1bPq#0;2;0;0;0\x1b\\sixel\n"  # DCS (sixel graphics)
    b"bell\x07 backspace\x08 nul\x00 \xff\xfe not utf-8 \xe2\x80\xae reversed\n"
    b"caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xe2\x9c\x93 kept\n"
)
SHOWN = [
    "step 1\t| loss 0.5",
    "cleared?",
    "title set",
    "C1 CSI",
    "sixel",
    "bell backspace nul \ufffd\ufffd not utf-8  reversed",
    "café 中文 ✓ kept",
]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b]52;c;ZXZpbA==\x07hello", "hello"),
        ("a\x1b[2Jb\x1b[10;20Hc", "abc"),
        ("\x1b[1;31mred\x1b[0m", "red"),
        ("\x1bcreset", "reset"),
        ("unterminated \x1b]52;c;abc\nnext", "unterminated \nnext"),
        ("tab\tand\nnewline", "tab\tand\nnewline"),
        ("\u202eevil\u2066", "evil"),
    ],
)
def test_printable_keeps_text_and_drops_sequences(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_logs_print_hostile_bytes_as_text(tmp_path, monkeypatch, capsys) -> None:
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", JOB, 200, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                    "metadata": {"name": "demo"}})  # fmt: skip
        pods = [{"metadata": {"name": "demo-worker-0"}}]
        api.route("GET", PODS, 200, {"kind": "PodList", "apiVersion": "v1", "items": pods})
        api.route("GET", f"{PODS}/demo-worker-0/log", 200, HOSTILE)
        capsys.readouterr()
        code = main(["logs", "demo", "--kubeconfig", client.kubeconfig])
        out, err = capsys.readouterr()
        through_api = [line.text for line in client.logs("demo")]
    assert code == 0, err
    assert not CONTROL.search(out), repr(out)
    assert out.splitlines() == [f"[demo-worker-0] {line}" for line in SHOWN]
    assert through_api == SHOWN


def test_status_prints_hostile_termination_messages_and_log_lines_as_text(
    tmp_path, monkeypatch, capsys
) -> None:
    ended = {"terminated": {"exitCode": 5, "message": "\x1b]52;c;eA==\x07retries exhausted\x1b[2J"}}
    pod = {"metadata": {"name": "demo-worker-0"},
           "status": {"phase": "Failed", "containerStatuses": [{"state": ended}]}}  # fmt: skip
    log = b"2026-01-01T00:00:00Z step 3/10 | loss 1.0\x1b[2J\n2026-01-01T00:00:01Z \x1b]0;x\x07"
    with fake_cluster("client", tmp_path, monkeypatch) as (api, client):
        api.route("GET", JOB, 200, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                    "metadata": {"name": "demo"}})  # fmt: skip
        api.route("GET", PODS, 200, {"kind": "PodList", "apiVersion": "v1", "items": [pod]})
        api.route("GET", f"{PODS}/demo-worker-0/log", 200, log)
        capsys.readouterr()
        code = main(["status", "demo", "--kubeconfig", client.kubeconfig])
        out, err = capsys.readouterr()
    assert code == 0, err
    assert not CONTROL.search(out), repr(out)
    assert "    ended exit 5: retries exhausted" in out.splitlines()
