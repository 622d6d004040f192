"""The CLI's top level follows trainer/exit_codes.py: a bug is one INTERNAL_ERROR line (the
traceback with KUBEDDP_DEBUG=1), Ctrl-C is INTERRUPTED, and `validate` tells problems found (1)
from unreadable input (2) and an unusable cluster (3). Names are checked before any request."""

from __future__ import annotations

import pytest
import yaml

from kubeddp.tools.cli import main as cli
from kubeddp.tools.cluster import kube
from kubeddp.tools.manifests import validate
from kubeddp.tools.manifests.resources import CONFIG_MAP
from kubeddp.trainer import exit_codes
from tests.helpers import fake_api

pytestmark = pytest.mark.timeout(60)
CONFIG_MAP_DOC = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _file(tmp_path, doc) -> str:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_a_bug_is_one_internal_error_line(tmp_path, monkeypatch, capsys) -> None:
    def broken(*args, **kwargs):
        raise KeyError("spec")  # what a bug in a validation rule looks like

    monkeypatch.setattr(validate, "document_issues", broken)
    monkeypatch.delenv("KUBEDDP_DEBUG", raising=False)
    code, _, err = _run(["validate", _file(tmp_path, CONFIG_MAP_DOC)], capsys)
    assert code == exit_codes.INTERNAL_ERROR
    (line,) = err.strip().splitlines()
    assert "internal error: KeyError" in line and "KUBEDDP_DEBUG=1" in line
    monkeypatch.setenv("KUBEDDP_DEBUG", "1")
    with pytest.raises(KeyError):
        cli.main(["validate", _file(tmp_path, CONFIG_MAP_DOC)])


def test_ctrl_c_is_interrupted_quietly(monkeypatch, capsys) -> None:
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.CLUSTER_HANDLERS, "status", interrupted)
    code, _, err = _run(["status", "demo"], capsys)
    assert code == exit_codes.INTERRUPTED and err.strip() == "kubeddp status: interrupted"


def test_validate_codes(tmp_path, capsys) -> None:
    good = _file(tmp_path, CONFIG_MAP_DOC)
    assert _run(["validate", good], capsys)[0] == 0
    bad = _file(tmp_path, {**CONFIG_MAP_DOC, "data": {"n": 1}})
    code, out, err = _run(["validate", bad], capsys)
    assert code == exit_codes.TRAINING_FAILED and "data.n" in out and "1 problem(s)" in err
    (tmp_path / "t.yaml").write_text("a: [1\n")
    assert _run(["validate", str(tmp_path / "t.yaml")], capsys)[0] == exit_codes.BAD_INPUT
    job = _file(tmp_path, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"})
    with fake_api.running() as server:
        server.misbehaviour = "500"
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kc", server.url)
        argv = ["validate", job, "--validate-against", "cluster", "--kubeconfig", str(kubeconfig)]
        code, _, err = _run(argv, capsys)
    assert code == exit_codes.CLUSTER_ERROR and "(500)" in err


@pytest.mark.parametrize("name", ["../x", "x?dryRun=All", "X", "", "a" * 254, "a/b", "é"])
def test_object_paths_are_made_from_checked_names_only(name: str) -> None:
    with pytest.raises(kube.KubeInputError) as err:
        kube.object_path(CONFIG_MAP, "team", name)
    assert err.value.exit_code == exit_codes.BAD_INPUT
    with pytest.raises(kube.KubeInputError, match="namespace"):
        kube.object_path(CONFIG_MAP, name or "A", "ok")
    assert kube.object_path(CONFIG_MAP, "team", "demo-config") == (
        "/api/v1/namespaces/team/configmaps/demo-config"
    )


def test_the_client_gets_whole_second_timeouts(tmp_path) -> None:
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")
    cluster = kube.Cluster(str(kubeconfig), request_timeout=2.7)
    assert cluster.timeout == (2, 2) and all(type(t) is int for t in cluster.timeout)
    assert kube.Cluster(str(kubeconfig)).timeout == (10, 30)
