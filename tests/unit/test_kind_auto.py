"""The kind a job runs when the user names none: `kubeddp submit` asks the cluster's API
discovery (the fake API server answers /apis and /apis/<group>/<version> as a real one does),
`kubeddp render` reads no cluster and says which kind it wrote in its first line, and the
chart's `kind: auto` reads Helm's capabilities (here through the in-process engine; the helm
binaries: tests/unit/test_chart_helm_cli.py)."""

from __future__ import annotations

import json
import re

import helm_python
import pytest

from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.resources import Resource
from kubeddp.trainer.exit_codes import CLUSTER_ERROR
from tests.helpers.chart import NAMESPACE, RELEASE, chart, render
from tests.helpers.cluster_commands import (
    CLAIMS,
    CONFIGMAPS,
    NS,
    PYTORCHJOBS,
    RUNTIMES,
    SERVICES,
    TRAINJOBS,
    run,
)
from tests.helpers.render import render_job

pytestmark = pytest.mark.timeout(60)
TRAINER = KINDS["trainjob"].resource
TRAINING_OPERATOR = KINDS["pytorchjob"].resource
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
JOB_KINDS = ("PyTorchJob", "TrainJob", "Job")
SUBMIT = ["submit", "--name", "demo", "--validate-against", "offline"]


def discovery_paths(api) -> list[str]:
    """/apis and /apis/<group>/<version>, in the order asked."""
    return [r["path"] for r in api.calls("GET") if re.fullmatch(r"/apis(/[^/]+/[^/]+)?", r["path"])]


def posted_job(api) -> dict:
    (job,) = [r["body"] for r in api.calls("POST") if r["body"]["kind"] in JOB_KINDS]
    return job


def accept_posts(api, *paths: str) -> None:
    for path in paths:
        api.route("POST", path, 201)


def test_submit_without_a_kind_runs_a_trainjob_where_trainer_is_served(api, capsys) -> None:
    api.serve(TRAINING_OPERATOR, TRAINER)
    accept_posts(api, CONFIGMAPS, CLAIMS, RUNTIMES, TRAINJOBS)
    code, out, err = run(SUBMIT, capsys)
    assert code == 0, err
    assert posted_job(api)["kind"] == "TrainJob"
    assert err.splitlines()[0] == (
        "kubeddp submit: kind trainjob: the cluster serves trainer.kubeflow.org/v1alpha1/TrainJob "
        "(name a KIND to choose)"
    )
    # the groups, then the one version that decides (Trainer's comes first)
    assert discovery_paths(api) == ["/apis", "/apis/trainer.kubeflow.org/v1alpha1"]
    assert "trainjob/demo created in team" in out


def test_submit_without_a_kind_runs_a_pytorchjob_where_only_training_operator_is(
    api, capsys
) -> None:
    api.serve(TRAINING_OPERATOR)
    accept_posts(api, CONFIGMAPS, CLAIMS, PYTORCHJOBS)
    code, _, err = run(SUBMIT, capsys)
    assert code == 0, err
    assert posted_job(api)["kind"] == "PyTorchJob"
    assert "kind pytorchjob: the cluster serves kubeflow.org/v1/PyTorchJob" in err


@pytest.mark.parametrize(
    "served",
    [
        (),
        # Kubeflow Notebooks serve kubeflow.org/v1 too: the group version alone is not enough
        (Resource("Notebook", "kubeflow.org", "v1", "notebooks"),),
        # the group at a version kubeddp does not render
        (Resource("TrainJob", "trainer.kubeflow.org", "v1beta9", "trainjobs"),),
    ],
    ids=["no operator", "notebooks only", "other trainer version"],
)
def test_submit_without_a_kind_runs_an_indexed_job_where_neither_is(api, capsys, served):
    api.serve(*served)
    accept_posts(api, CONFIGMAPS, CLAIMS, SERVICES, JOBS)
    code, _, err = run(SUBMIT, capsys)
    assert code == 0, err
    job = posted_job(api)
    assert (job["kind"], job["spec"]["completionMode"]) == ("Job", "Indexed")
    assert (
        "kind indexedjob: the cluster serves neither trainer.kubeflow.org/v1alpha1/TrainJob "
        "nor kubeflow.org/v1/PyTorchJob"
    ) in err


def test_a_kind_given_wins_and_asks_no_discovery(api, capsys) -> None:
    api.serve(TRAINER)
    accept_posts(api, CONFIGMAPS, CLAIMS, PYTORCHJOBS)
    code, _, err = run(["submit", "pytorchjob", *SUBMIT[1:]], capsys)
    assert code == 0, err
    assert posted_job(api)["kind"] == "PyTorchJob"
    assert discovery_paths(api) == [] and "kind " not in err


def test_the_python_api_submits_the_discovered_kind(api) -> None:
    from kubeddp.client import Client

    api.serve(TRAINER)
    said: list[str] = []
    (text,) = Client(say=said.append).submit(dry_run="client", validate_against="offline", nodes=2)
    assert "kind: TrainJob" in text and api.calls("POST") == []
    assert said[0].startswith("kubeddp submit: kind trainjob:")


@pytest.mark.parametrize("misbehaviour", ["empty-object", "wrong-kind", "html"])
def test_discovery_that_is_not_the_apis_answer_creates_nothing(api, capsys, misbehaviour):
    api.misbehaviour = misbehaviour
    code, _, err = run(SUBMIT, capsys)
    assert code == CLUSTER_ERROR, err
    assert api.calls("POST") == []
    (line,) = err.strip().splitlines()
    assert "GET /apis" in line and "check that the kubeconfig's server" in line


def test_a_resource_list_of_another_version_is_not_believed(api, capsys) -> None:
    api.serve(TRAINER)
    api.route("GET", "/apis/trainer.kubeflow.org/v1alpha1", 200, {
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "batch/v1",
        "resources": [{"name": "trainjobs", "kind": "TrainJob"}],
    })  # fmt: skip
    code, _, err = run(SUBMIT, capsys)
    assert code == CLUSTER_ERROR and api.calls("POST") == []
    assert "trainer.kubeflow.org/v1alpha1's list" in err


# ---- render: no cluster, a documented kind said first ----------------------------------------


def test_render_without_a_kind_writes_an_indexed_job_and_says_so_first(capsys, tmp_path):
    code, out, err = run(["render", "--name", "demo", "--kubeconfig", str(tmp_path / "none")],
                         capsys)  # fmt: skip
    assert code == 0, err
    assert err.splitlines()[0].startswith(
        "kubeddp render: note: no KIND given: rendering an IndexedJob (needs no operator; "
        "render reads no cluster)"
    )
    assert "kind: Job" in out and "completionMode: Indexed" in out
    named = render_job("indexedjob", "--name", "demo")
    assert [d["kind"] for d in render_job("--name", "demo")] == [d["kind"] for d in named]


# ---- the chart through the in-process engine (helm-python-sdk) -------------------------------


def job_kind(docs: list[dict]) -> str:
    (kind,) = [d["kind"] for d in docs if d["kind"] in JOB_KINDS]
    return kind


def test_the_library_renders_kind_auto_as_helm_template_does_without_a_cluster() -> None:
    assert job_kind(render({})) == "Job"
    for name, kind in KINDS.items():
        assert job_kind(render({"kind": kind.chart_kind})) == kind.resource.kind, name


def rendered_with_api_versions(values: dict, api_versions: list[str]) -> dict[str, str]:
    """The library's C core takes Helm's --api-versions (its `api_versions` option); the
    Python wrapper's render() does not pass it on, so it is called as render() calls it."""
    native = getattr(helm_python, "_native", None)
    if native is None or not hasattr(native, "call_string"):
        pytest.skip("this helm-python-sdk has no _native.call_string to pass api_versions")
    options = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True,
               "api_versions": api_versions}  # fmt: skip
    text = native.call_string("helm_render", chart()._raw(), json.dumps(values),
                              json.dumps(options))  # fmt: skip
    return json.loads(text)


@pytest.mark.parametrize(
    ("apis", "expected"),
    [([TRAINER.key], "TrainJob"), ([TRAINING_OPERATOR.key], "PyTorchJob"), ([], "IndexedJob")],
)
def test_the_library_with_api_versions_picks_and_notes_say_why(apis, expected) -> None:
    rendered = rendered_with_api_versions({}, apis)
    notes = rendered["kubeddp/templates/NOTES.txt"]
    assert f'kubeddp {chart().metadata["appVersion"]}: {expected} "demo-kubeddp"' in notes
    if expected == "IndexedJob":
        assert "kind auto: IndexedJob, since Helm sees the API of neither TrainJob nor " in notes
    else:
        assert f"kind auto: {expected}, since the cluster serves {apis[0]}" in notes
    given = rendered_with_api_versions({"kind": "IndexedJob"}, apis)["kubeddp/templates/NOTES.txt"]
    assert "kind auto" not in given and "IndexedJob" in given


# ---- Trainer v2.4.0's release notes, checked against what kubeddp renders ---------------------

# "limit ReplicatedJob name length to 20 characters in runtimes" (Trainer v2.4.0, #4394)
TRAINER_2_4_MAX_REPLICATED_JOB_NAME = 20


def test_the_runtime_kubeddp_renders_meets_trainer_2_4s_replicated_job_names() -> None:
    docs = render_job("trainjob", "--name", "a-job-name-of-forty-characters-long-abcd")
    (runtime,) = [d for d in docs if d["kind"] == "TrainingRuntime"]
    names = [job["name"] for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
    assert names and all(len(n) <= TRAINER_2_4_MAX_REPLICATED_JOB_NAME for n in names), names
    (job,) = [d for d in docs if d["kind"] == "TrainJob"]
    patched = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert [r["name"] for r in patched["replicatedJobs"]] == names
