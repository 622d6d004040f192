"""`kubeddp submit trainjob` against the fake API server with Trainer v2.3's TrainJob webhook
(tests/helpers/admission.py): the webhook reads runtimes from an informer cache that runs
`lag` requests behind, so the TrainJob sent right after its runtime is refused for a moment.
submit retries that refusal only, only for the runtime it just created, and only until its
deadline; a server dry run cannot create the runtime the webhook needs and says so."""

from __future__ import annotations

import pytest

from kubeddp.tools.cluster import trainjob_submit
from kubeddp.trainer.exit_codes import CLUSTER_ERROR
from tests.helpers import fake_api
from tests.helpers.admission import ApiObjects
from tests.helpers.cluster_commands import CLAIMS, CONFIGMAPS, NS, run

pytestmark = pytest.mark.timeout(60)
REFUSAL = "specified trainingRuntime must be created before the TrainJob is created"
SUBMIT = ["submit", "trainjob", "--name", "demo", "--validate-against", "offline"]


@pytest.fixture
def api(tmp_path, monkeypatch):
    with fake_api.running() as server:
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", server.url)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        server.route("POST", CONFIGMAPS, 201)
        server.route("POST", CLAIMS, 201)
        yield server


def trainer(server: fake_api.FakeApiServer, lag: int) -> ApiObjects:
    objects = ApiObjects(lag=lag, namespace=NS)
    objects.seed({"kind": "ClusterTrainingRuntime", "metadata": {"name": "torch-distributed"}})
    server.admission = objects
    return objects


def trainjob_outcomes(objects: ApiObjects) -> list[str]:
    return [outcome for _, kind, _, outcome in objects.log if kind == "TrainJob"]


def test_submit_waits_until_trainers_webhook_sees_the_runtime(api, capsys) -> None:
    objects = trainer(api, lag=2)
    code, out, err = run(SUBMIT, capsys)
    assert code == 0, err
    assert objects.created_kinds() == ["TrainingRuntime", "TrainJob"]
    assert trainjob_outcomes(objects) == ["Forbidden", "Forbidden", "created"]
    assert "trainjob/demo created in team" in out


def test_a_runtime_the_submission_did_not_create_is_not_waited_for(api, capsys) -> None:
    """A missing runtime is named at once, as Trainer's refusal, not as an RBAC problem."""
    objects = trainer(api, lag=0)
    code, _, err = run([*SUBMIT, "--no-own-runtime", "--runtime-name", "nope"], capsys)
    assert code == CLUSTER_ERROR
    assert trainjob_outcomes(objects) == ["Forbidden"]
    (line,) = err.strip().splitlines()[-1:]
    assert "refused" in line and "specified clusterTrainingRuntime must be created" in line
    assert "rbac" not in line.lower()


def test_a_runtime_that_never_shows_ends_with_one_line_at_the_deadline(
    api, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(trainjob_submit, "RUNTIME_WAIT_SECONDS", 1.0)
    objects = trainer(api, lag=10**9)
    code, _, err = run(SUBMIT, capsys)
    assert code == CLUSTER_ERROR
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "still refuses TrainJob demo" in errors[0], err
    assert "kubectl apply -f" in errors[0]
    outcomes = trainjob_outcomes(objects)
    assert len(outcomes) >= 2 and set(outcomes) == {"Forbidden"}


def test_other_refusals_are_not_retried(api, capsys) -> None:
    """An object the webhook refuses for any other reason fails at the first answer."""
    api.route(
        "POST",
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs",
        403,
        fake_api.status_body(
            403, "Forbidden", 'admission webhook "x" denied the request: numNodes too large'
        ),
    )
    api.route("POST", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainingruntimes", 201)
    code, _, err = run(SUBMIT, capsys)
    assert code == CLUSTER_ERROR and "numNodes too large" in err
    # the runtime, then one TrainJob; what the job owns comes after it, so nothing else is made
    assert [p["body"]["kind"] for p in api.calls("POST")] == ["TrainingRuntime", "TrainJob"]


def test_a_server_dry_run_says_the_webhook_could_not_check_the_trainjob(api, capsys) -> None:
    objects = trainer(api, lag=0)
    code, out, err = run([*SUBMIT, "--dry-run", "server"], capsys)
    assert code == 0, err
    assert trainjob_outcomes(objects) == ["Forbidden"]
    assert (
        "trainjob/demo created in team (server dry run); Trainer's webhook could not check it: "
        "its TrainingRuntime demo comes with this submission, which a dry run does not create"
    ) in out
    assert objects.created_kinds() == []
