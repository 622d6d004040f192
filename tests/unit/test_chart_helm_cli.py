"""The chart under the helm binaries users install (tests/helpers/helm_cli.py: 3.16, 3.18, 4.1).

`kubeddp render` and the other chart tests use helm-python-sdk (Helm 4's Go library). Helm 3
validates values.schema.json with another JSON-schema engine, so each binary is checked here:
- `helm lint --strict` passes with the defaults and every ci/ values file, and fails on bad input;
- `helm template` makes the same objects as the library for each of them;
- every value the schema refuses stops `helm template` with its message;
- every `fail` rule stops `helm template` of Helm 3.16 with its message: the rules are
  templates, which Helm 3 and 4 run with the same engine (the library, Helm 4's, runs each in
  tests/unit/test_chart_schema.py), so one binary of the other major version is enough;
- a packaged chart renders as the folder does;
and `kubectl kustomize k8s/` builds what k8s/kustomization.yaml lists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import helm_cli
from tests.helpers.chart import CHART, CI_FILES, NAMESPACE, RELEASE, ci_values, render
from tests.helpers.chart_refusals import FAIL_RULES, SCHEMA_REJECTS
from tests.helpers.helm_cli import HELM_3_OLDEST, KUBECTL, RELEASES, Release
from tests.helpers.render import secret_values_masked

K8S = CHART.parents[1] / "k8s"
SCHEMA_HEADER = "values don't meet the specifications of the schema"

pytestmark = pytest.mark.timeout(300)
each_helm = pytest.mark.parametrize("release", RELEASES, ids=lambda r: f"helm-{r.helm_version}")


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's cache, config and data folders in a scratch place, not the user's home."""
    home = tmp_path_factory.mktemp("helm-home")
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        **{f"HELM_{part}_HOME": str(home / part.lower()) for part in ("CACHE", "CONFIG", "DATA")},
    }


def helm(release: Release, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    binary = helm_cli.require(release, "helm")
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, env=env, timeout=120
    )


def values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def ordered(docs: list[dict]) -> list[dict]:
    """By kind and name; a Secret's values masked (each render makes a new keeper secret)."""
    docs = secret_values_masked([doc for doc in docs if doc])
    return sorted(docs, key=lambda d: (d["kind"], d["metadata"]["name"]))


def objects(text: str) -> list[dict]:
    return ordered(list(yaml.safe_load_all(text)))


def keys_of(values: Any) -> list[str]:
    if isinstance(values, dict):
        return [*values, *(key for value in values.values() for key in keys_of(value))]
    if isinstance(values, list):
        return [key for item in values for key in keys_of(item)]
    return []


CASES = [None, *CI_FILES]  # None: the chart's defaults
case_ids = ["defaults", *(path.stem for path in CI_FILES)]


@each_helm
@pytest.mark.parametrize("values_path", CASES, ids=case_ids)
def test_lint_strict_passes(release: Release, values_path: Path | None, helm_home) -> None:
    extra = ["-f", str(values_path)] if values_path else []
    done = helm(release, helm_home, "lint", "--strict", str(CHART), *extra)
    assert done.returncode == 0, done.stdout + done.stderr


@each_helm
def test_lint_strict_fails_on_a_wrong_type(release: Release, helm_home) -> None:
    done = helm(release, helm_home, "lint", "--strict", str(CHART), "--set-string", "nodes=two")
    assert done.returncode != 0 and "nodes" in done.stdout + done.stderr


@each_helm
@pytest.mark.parametrize("values_path", CASES, ids=case_ids)
def test_template_makes_what_the_library_makes(
    release: Release, values_path: Path | None, helm_home
) -> None:
    extra = ["-f", str(values_path)] if values_path else []
    done = helm(
        release, helm_home, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra
    )
    assert done.returncode == 0, done.stderr
    library = render(ci_values(values_path) if values_path else {})
    assert objects(done.stdout) == ordered(library)


@each_helm
@pytest.mark.parametrize("case", SCHEMA_REJECTS)
def test_schema_refuses(release: Release, case: str, helm_home, tmp_path: Path) -> None:
    values, _ = SCHEMA_REJECTS[case]
    done = helm(
        release, helm_home, "template", RELEASE, str(CHART), "-f", values_file(tmp_path, values)
    )
    assert done.returncode != 0 and SCHEMA_HEADER in done.stderr, done.stderr
    problems = done.stderr.split(SCHEMA_HEADER, 1)[1]
    assert any(key in problems for key in keys_of(values)), done.stderr  # it names the value


@pytest.mark.parametrize("case", FAIL_RULES)
def test_fail_rule_stops_template(case: str, helm_home, tmp_path) -> None:
    values, release_name, pattern = FAIL_RULES[case]
    done = helm(
        HELM_3_OLDEST,
        helm_home,
        "template",
        release_name,
        str(CHART),
        "-f",
        values_file(tmp_path, values),
    )
    assert done.returncode != 0 and re.search(pattern, done.stderr), done.stderr
    assert SCHEMA_HEADER not in done.stderr  # the template rule, not the schema


TRAINER_API = "trainer.kubeflow.org/v1alpha1/TrainJob"
TRAINING_OPERATOR_API = "kubeflow.org/v1/PyTorchJob"
# --api-versions given -> the job kind `kind: auto` renders
AUTO_CASES = {
    "no cluster": ((), "Job"),
    "trainer only": ((TRAINER_API,), "TrainJob"),
    "training-operator only": ((TRAINING_OPERATOR_API,), "PyTorchJob"),
    "both": ((TRAINING_OPERATOR_API, TRAINER_API), "TrainJob"),
    # kubeflow.org/v1 without PyTorchJob (Kubeflow Notebooks' group): not training-operator
    "notebooks only": (("kubeflow.org/v1", "kubeflow.org/v1/Notebook"), "Job"),
}
JOB_KINDS = ("PyTorchJob", "TrainJob", "Job")


def job_kind_of(text: str) -> str:
    (kind,) = [doc["kind"] for doc in yaml.safe_load_all(text) if doc and doc["kind"] in JOB_KINDS]
    return kind


@each_helm
@pytest.mark.parametrize("case", AUTO_CASES)
def test_kind_auto_renders_the_kind_the_api_versions_say(
    release: Release, case: str, helm_home
) -> None:
    """`helm template --api-versions` stands for the cluster's discovery (Helm's capabilities)."""
    apis, expected = AUTO_CASES[case]
    extra = [arg for api in apis for arg in ("--api-versions", api)]
    done = helm(release, helm_home, "template", RELEASE, str(CHART), *extra)
    assert done.returncode == 0, done.stderr
    assert job_kind_of(done.stdout) == expected


@pytest.mark.parametrize("kind", ["PyTorchJob", "IndexedJob"])
def test_a_kind_given_wins_over_the_api_versions(kind: str, helm_home) -> None:
    done = helm(
        HELM_3_OLDEST, helm_home, "template", RELEASE, str(CHART), "--set", f"kind={kind}",
        "--api-versions", TRAINER_API,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert job_kind_of(done.stdout) == {"IndexedJob": "Job"}.get(kind, kind)


@each_helm
def test_packaged_chart_renders_as_the_folder(release: Release, helm_home, tmp_path) -> None:
    packed = helm(release, helm_home, "package", str(CHART), "--destination", str(tmp_path))
    assert packed.returncode == 0, packed.stderr
    (archive,) = tmp_path.glob("kubeddp-*.tgz")
    from_archive = helm(release, helm_home, "template", RELEASE, str(archive))
    from_folder = helm(release, helm_home, "template", RELEASE, str(CHART))
    assert from_archive.returncode == 0, from_archive.stderr
    assert objects(from_archive.stdout) == objects(from_folder.stdout)


def test_kubectl_kustomize_builds_what_the_kustomization_lists() -> None:
    kubectl = helm_cli.require(KUBECTL, "kubectl")
    done = subprocess.run(
        [str(kubectl), "kustomize", str(K8S)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    expected = [doc for name in listed for doc in yaml.safe_load_all((K8S / name).read_text())]
    assert objects(done.stdout) == ordered(expected)
