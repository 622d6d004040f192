"""`kubeddp render` through the helm binary (tests/helpers/helm_cli.py's releases) and through
helm-python-sdk gives the same objects and the same errors; the values merge is Helm's; with
neither available, render says in one line what to install (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubeddp.tools.manifests import helm_engine
from kubeddp.tools.manifests.chart.render import RenderError, chart_dir
from tests.helpers import helm_cli
from tests.helpers.chart import CI_FILES, chart, ci_values
from tests.helpers.chart_refusals import FAIL_RULES
from tests.helpers.helm_cli import RELEASES
from tests.helpers.render import render_job, secret_values_masked

pytestmark = pytest.mark.timeout(300)
each_helm = pytest.mark.parametrize("release", RELEASES, ids=lambda r: f"helm-{r.helm_version}")
JOBS = [
    ("pytorchjob",),
    ("pytorchjob", "--nodes", "3", "--gpus-per-node", "2", "-n", "ml", "--podmonitor"),
    ("pytorchjob", "--elastic", "2:4", "--checkpoint-size", "5Gi"),
    ("trainjob", "--nodes", "2", "--script", "train.py"),
    ("indexedjob", "--nodes", "2", "--env", "A=1", "--set", "train.max_steps=5"),
]


@pytest.fixture
def with_binary(release, monkeypatch: pytest.MonkeyPatch) -> str:
    binary = str(helm_cli.require(release, "helm"))
    monkeypatch.setenv(helm_engine.ENV, binary)
    return binary


@each_helm
@pytest.mark.parametrize("job", JOBS, ids=lambda j: " ".join(j))
def test_binary_and_library_render_the_same_objects(
    job: tuple[str, ...], with_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    through_binary = render_job(*job)
    monkeypatch.setenv(helm_engine.ENV, helm_engine.LIBRARY)
    assert secret_values_masked(render_job(*job)) == secret_values_masked(through_binary)


@each_helm
@pytest.mark.parametrize("case", ["more processes than GPUs", "elastic min > max"])
def test_binary_and_library_fail_with_the_same_line(
    case: str, with_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert case in FAIL_RULES  # the chart's own rules, as render's options
    argv = {
        "more processes than GPUs": ("pytorchjob", "--gpus-per-node", "2", "--nproc-per-node", "4"),
        "elastic min > max": ("pytorchjob", "--elastic", "4:2"),
    }[case]
    with pytest.raises(RenderError) as binary_error:
        render_job(*argv)
    monkeypatch.setenv(helm_engine.ENV, helm_engine.LIBRARY)
    with pytest.raises(RenderError) as library_error:
        render_job(*argv)
    assert str(binary_error.value) == str(library_error.value)
    assert "\n" not in str(binary_error.value)


@pytest.mark.parametrize("path", CI_FILES, ids=lambda p: p.name)
def test_merge_is_helms_coalesce(path: Path) -> None:
    values = ci_values(path)
    defaults = helm_engine.chart_defaults(chart_dir())
    assert helm_engine.merge_values(defaults, values) == chart().merge_values(values)


def test_null_removes_a_default_as_in_helm() -> None:
    values = {
        "monitoring": {"podMonitor": None, "new": None},
        "shmSize": None,
        "new": {"a": None, "b": 1},
    }
    defaults = helm_engine.chart_defaults(chart_dir())
    assert helm_engine.merge_values(defaults, values) == chart().merge_values(values)


def test_split_keeps_each_template_apart() -> None:
    text = (
        "---\n# Source: c/templates/a.yaml\na: |-\n  x\n---\n# Source: c/templates/b.yaml\nb: 2\n"
    )
    assert helm_engine._split_sources(text) == {
        "c/templates/a.yaml": "a: |-\n  x\n",
        "c/templates/b.yaml": "b: 2\n",
    }
    assert yaml.safe_load(helm_engine._split_sources(text)["c/templates/a.yaml"]) == {"a": "x"}


def _kubeddp(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from kubeddp.tools.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_helm_that_cannot_run_is_one_line_exit_2(tmp_path: Path) -> None:
    not_helm = tmp_path / "helm"
    not_helm.write_text("not a program")  # not executable
    env = {**os.environ, helm_engine.ENV: str(not_helm)}
    result = _kubeddp(env, "render", "pytorchjob", "--validate-against", "offline")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "pip install 'kubeddp[helm]'" in result.stderr


@each_helm
def test_binary_and_library_say_where_checkpoints_live(with_binary: str) -> None:
    """`helm template` renders no NOTES: the storage line comes from the job object."""
    argv = ("render", "pytorchjob", "--nodes", "2", "--validate-against", "offline")
    lines = {}
    for engine in (with_binary, helm_engine.LIBRARY):
        result = _kubeddp({**os.environ, helm_engine.ENV: engine}, *argv)
        assert result.returncode == 0, result.stderr
        lines[engine] = [x for x in result.stderr.splitlines() if "Checkpoints: " in x]
    assert lines[with_binary] == lines[helm_engine.LIBRARY]
    assert len(lines[with_binary]) == 1 and "keeper pod" in lines[with_binary][0]
