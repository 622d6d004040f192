"""Packaging: the wheel carries the Helm chart and `kubeddp render` uses that copy; a plain
install (no `cli` extra) answers the manifest commands with one line saying what to install,
never a traceback, and the cluster commands, with neither kubectl nor the `kube` extra's
client, likewise."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from kubeddp.tools.cli.client_errors import CLI_EXTRA_MODULES, INSTALL_CLI_EXTRA
from kubeddp.tools.cluster.kubectl_proxy import KUBECTL_ENV

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubeddp"

pytestmark = pytest.mark.timeout(180)


def chart_files() -> set[str]:
    """What `helm package` ships: the chart without ci/ and what .helmignore drops."""
    files = {p.relative_to(CHART).as_posix() for p in CHART.rglob("*") if p.is_file()}
    return {f for f in files if not f.startswith("ci/") and "__pycache__" not in f}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--wheel-dir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=150,
    )
    (built,) = out.glob("kubeddp-*.whl")
    return built


def test_wheel_contains_the_chart(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {name.removeprefix("kubeddp/chart/") for name in names if "kubeddp/chart/" in name}
    assert shipped == chart_files()
    assert {"Chart.yaml", "values.schema.json", "templates/_constants.tpl"} <= shipped


def test_render_uses_the_chart_in_the_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = textwrap.dedent(
        f"""
        from kubeddp.tools.cli.main import main
        from kubeddp.tools.manifests.chart.render import chart_dir
        assert str(chart_dir()).startswith({str(site)!r}), chart_dir()
        raise SystemExit(main(["render", "indexedjob", "--validate-against", "offline"]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "kind: Job" in done.stdout and "kind: Service" in done.stdout


def run_without(modules: tuple[str, ...], argv: list[str], tmp_path: Path):
    """The CLI with these modules unimportable, as in an install without the `cli` extra."""
    script = textwrap.dedent(
        f"""
        import sys
        for name in {list(modules)!r}:
            sys.modules[name] = None
        from kubeddp.tools.cli.main import main
        raise SystemExit(main({argv!r}))
        """
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        # No kubectl: $KUBEDDP_KUBECTL names one that is not there (PATH may have one).
        env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", KUBECTL_ENV: "/nonexistent"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


COMMANDS = {
    "render": ["render", "pytorchjob", "--validate-against", "offline"],
    "render-auto": ["render", "trainjob"],
    "validate": ["validate", "job.yaml", "--validate-against", "offline"],
    "submit": ["submit", "pytorchjob", "--validate-against", "offline"],
    "submit-file": ["submit", "-f", "job.yaml", "--validate-against", "offline"],
}
# The cluster commands need kubectl or the `kube` extra's client (tools/cluster/kube_transport.py).
CLUSTER_COMMANDS = {
    "status": ["status", "demo"],
    "logs": ["logs", "demo"],
    "wait": ["wait", "demo", "--timeout", "1"],
    "delete": ["delete", "demo"],
}
# A plain install: no `cli` extra, no client (the `sdk` extra's kubeflow would bring one).
PLAIN = (*CLI_EXTRA_MODULES, "kubernetes", "kubeflow")
JOB = "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: demo}\nspec: {}\n"


def assert_one_install_line(done) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert INSTALL_CLI_EXTRA in lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_plain_install_says_what_to_install(command: str, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    done = run_without(PLAIN, COMMANDS[command], tmp_path)
    assert_one_install_line(done)
    assert done.stdout == ""


@pytest.mark.parametrize("command", CLUSTER_COMMANDS)
def test_no_kubectl_and_no_client_says_what_to_install(command: str, tmp_path: Path) -> None:
    done = run_without(PLAIN, CLUSTER_COMMANDS[command], tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "install kubectl" in line and "pip install 'kubeddp[kube]'" in line, line


# A command that needs each library of the extra (offline: no cluster is asked).
NEEDS = {
    "jsonschema": ["render", "pytorchjob", "--validate-against", "offline"],
}


def test_every_library_of_the_extra_is_covered() -> None:
    assert sorted(NEEDS) == sorted(CLI_EXTRA_MODULES)


@pytest.mark.parametrize("module", sorted(NEEDS))
def test_each_missing_library_is_named(module: str, tmp_path: Path) -> None:
    done = run_without((module,), NEEDS[module], tmp_path)
    assert_one_install_line(done)
    assert module in done.stderr


@pytest.mark.parametrize("command", ["render", "render-auto", "submit"])
def test_no_helm_anywhere_says_what_to_install(command: str, tmp_path: Path) -> None:
    """PATH has no helm binary and the `helm` extra is not installed: one line, exit 2."""
    done = run_without(("helm_python",), COMMANDS[command], tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "helm binary" in line and "pip install 'kubeddp[helm]'" in line
    assert done.stdout == ""


def test_wheel_carries_the_validation_schemas(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    schemas = {n for n in names if n.startswith("kubeddp/tools/manifests/schemas/")}
    assert {n.rsplit("/", 1)[1] for n in schemas} == {
        "core-v1.37.0.json",
        "pytorchjob-v1.9.4.json",
        "trainjob-v2.3.0.json",
        "trainingruntime-v2.3.0.json",
    }


def test_help_and_launch_need_no_extra(tmp_path: Path) -> None:
    done = run_without(CLI_EXTRA_MODULES, ["render", "--help"], tmp_path)
    assert done.returncode == 0 and "--gpus-per-node" in done.stdout, done.stderr


def test_wheel_states_its_license_as_an_spdx_expression(wheel: Path) -> None:
    """pyproject's `license = "Apache-2.0"` (PEP 639; the table form is deprecated): the wheel's
    metadata carries it as License-Expression, without the old free-text License field."""
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        headers = archive.read(meta).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert not [h for h in headers if h.startswith("License:")]


def extra(name: str) -> list[Requirement]:
    """An optional-dependencies list of pyproject.toml, read as written."""
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(rf"^{name} = \[(.*?)\]$", text, re.S | re.M)
    assert found, f"pyproject.toml: no extra {name}"
    return [Requirement(r) for r in re.findall(r'"([^"]+)"', found.group(1))]


def test_dev_gets_the_newest_kubernetes_client_not_the_sdks_pin() -> None:
    """`.[dev]` is the `sdk` extra but kubeflow-training, whose kubernetes<36 would hold the
    developers' client below the one `[cli,kube]` users get (test_install runs the SDK in a
    venv of its own)."""
    dev = extra("dev")
    (own,) = [r for r in dev if r.name == "kubeddp"]
    assert {"cli", "kube"} <= own.extras and "sdk" not in own.extras
    assert "kubeflow-training" not in {r.name for r in dev}
    sdk_but_training = {str(r) for r in extra("sdk") if r.name != "kubeflow-training"}
    assert sdk_but_training <= {str(r) for r in dev}, "keep dev's copy of the sdk extra in step"
