"""Several files in $KUBECONFIG merge as kubectl merges them (first wins each name and the
current-context; missing files are skipped; relative file paths stay with their file), and the
cluster commands use the merged config against a real HTTP server (tests/helpers/fake_api.py)."""

from __future__ import annotations

import os

import pytest
import yaml

from kubeddp.tools.cli.main import main
from kubeddp.tools.cluster import kubeconfig
from tests.helpers import fake_api, reference

pytestmark = pytest.mark.timeout(60)
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org"


def write(path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_first_file_wins_each_name_and_the_current_context(tmp_path) -> None:
    (tmp_path / "b").mkdir()
    first = write(tmp_path / "a.yaml", {
        "current-context": "one",
        "clusters": [{"name": "c", "cluster": {"server": "https://first"}}],
        "contexts": [{"name": "one", "context": {"cluster": "c", "user": "u"}}],
    })  # fmt: skip
    second = write(tmp_path / "b" / "config", {
        "current-context": "two",
        "clusters": [
            {"name": "c", "cluster": {"server": "https://second"}},
            {"name": "d", "cluster": {"server": "https://d", "certificate-authority": "ca.crt"}},
        ],
        "users": [{"name": "u", "user": {"token": "t", "tokenFile": "token"}}],
        "contexts": [{"name": "two", "context": {"cluster": "d", "user": "u"}}],
    })  # fmt: skip
    merged = kubeconfig.merge([first, str(tmp_path / "missing"), second])
    assert merged["current-context"] == "one"
    assert [c["cluster"]["server"] for c in merged["clusters"]] == ["https://first", "https://d"]
    assert merged["clusters"][1]["cluster"]["certificate-authority"] == str(
        (tmp_path / "b" / "ca.crt").resolve()
    )
    assert merged["users"][0]["user"]["tokenFile"] == str((tmp_path / "b" / "token").resolve())
    assert [c["name"] for c in merged["contexts"]] == ["one", "two"]


def test_kubeconfig_list_is_split_like_kubectl() -> None:
    assert kubeconfig.paths_from_env(f"a{os.pathsep}{os.pathsep}b") == ["a", "b"]


def test_cluster_commands_use_the_merged_files(tmp_path, monkeypatch, capsys) -> None:
    """The context is in the first file, the cluster and the user in the second."""
    with fake_api.running() as server:
        full = fake_api.kubeconfig_for(server.url)
        first = write(tmp_path / "contexts.yaml", {
            "current-context": "test", "contexts": full["contexts"],
        })  # fmt: skip
        second = write(tmp_path / "creds.yaml", {**full, "current-context": "elsewhere"})
        monkeypatch.setenv("KUBECONFIG", os.pathsep.join([first, second]))
        crd = yaml.safe_load(
            reference.read_text(reference.CRDS / "kubeflow.org_pytorchjobs.v1.9.4.yaml")
        )
        server.route("GET", CRD_PATH, 200, crd)
        code = main(["render", "pytorchjob", "--validate-against", "cluster"])
        out, err = capsys.readouterr()
    assert code == 0, err
    assert "kind: PyTorchJob" in out
    assert [r["path"] for r in server.requests] == [CRD_PATH]
