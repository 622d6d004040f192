"""`kubeddp submit` against the fake API server (tests/helpers/fake_api.py): the job is created
before what it owns, each of those carries an ownerReference to the job's uid (the API
server's garbage collector deletes them with the job; the claim outlives it), an object left by
an earlier job stops the submission before the job exists, and the job's keeper Secret is
created only when absent. Its value never appears in a line of any command."""

from __future__ import annotations

import base64
import copy

import pytest

from kubeddp.trainer import constants as C
from kubeddp.trainer.exit_codes import CLUSTER_ERROR
from tests.helpers import fake_api
from tests.helpers.cluster_commands import (
    CLAIMS,
    CONFIGMAPS,
    KEEPER_JOB_COMPANIONS,
    PYTORCHJOBS,
    RUNTIMES,
    SECRETS,
    TRAINJOBS,
    run,
)
from tests.helpers.fake_api import status_body

pytestmark = pytest.mark.timeout(60)
UID = "5a1c6a38-0d3b-4c3e-9a51-000000000001"
SUBMIT = ["submit", "pytorchjob", "--name", "demo", "--nodes", "2", "--validate-against", "offline"]
OWNER = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "demo", "uid": UID}


def created_with_uid(api: fake_api.FakeApiServer):
    """The API server's answer to a create: the object as sent, with its new uid."""

    def answer() -> dict:
        made = copy.deepcopy(api.calls("POST")[-1]["body"])
        made["metadata"]["uid"] = UID
        return made

    return answer


def echo(api: fake_api.FakeApiServer):
    return lambda: api.calls("POST")[-1]["body"]


def test_the_job_is_made_first_and_owns_what_follows_but_the_claim(api, capsys) -> None:
    api.route("POST", PYTORCHJOBS, 201, created_with_uid(api))
    for path in KEEPER_JOB_COMPANIONS:
        api.route("POST", path, 201, echo(api))
    code, out, err = run(SUBMIT, capsys)
    assert code == 0, err
    posts = api.calls("POST")
    assert [p["path"] for p in posts] == [PYTORCHJOBS, *KEEPER_JOB_COMPANIONS]
    for post in posts[1:]:
        owners = post["body"]["metadata"].get("ownerReferences")
        assert owners == (None if post["path"] == CLAIMS else [OWNER]), post["path"]
    # looked for before the job was made: none was there
    looked = [r["path"] for r in api.calls("GET") if r["path"].rsplit("/", 1)[0] in
              KEEPER_JOB_COMPANIONS]  # fmt: skip
    assert len(looked) == len(KEEPER_JOB_COMPANIONS)
    lines = out.splitlines()
    assert lines[0] == "pytorchjob/demo created in team"
    assert "deployment/demo-keeper created in team; owned by pytorchjob/demo" in lines
    assert "persistentvolumeclaim/demo-checkpoints created in team" in lines


def test_a_trainjobs_runtime_comes_before_it(api, capsys) -> None:
    api.route("POST", RUNTIMES, 201, echo(api))
    api.route("POST", TRAINJOBS, 201, created_with_uid(api))
    for path in (CONFIGMAPS, CLAIMS):
        api.route("POST", path, 201, echo(api))
    code, _, err = run(["submit", "trainjob", "--name", "demo", "--validate-against", "offline"],
                       capsys)  # fmt: skip
    assert code == 0, err
    posts = api.calls("POST")
    assert [p["path"] for p in posts] == [RUNTIMES, TRAINJOBS, CONFIGMAPS, CLAIMS]
    assert "ownerReferences" not in posts[0]["body"]["metadata"]  # Trainer's webhook needs it
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "demo",
             "uid": UID}  # fmt: skip
    assert posts[2]["body"]["metadata"]["ownerReferences"] == [owner]


def existing_secret(owned: bool) -> dict:
    meta: dict = {"name": "demo-keeper-token", "namespace": "team"}
    if owned:
        meta["ownerReferences"] = [{**OWNER, "uid": "an-earlier-job"}]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta,
            "data": {C.KEEPER_TOKEN_KEY: base64.b64encode(b"s3cr3t-" * 6).decode()}}  # fmt: skip


def test_an_existing_keeper_secret_is_kept_and_never_shown(api, capsys) -> None:
    """The value the running keeper and pods read: a new one would lock them out."""
    secret = existing_secret(owned=False)
    api.route("GET", f"{SECRETS}/demo-keeper-token", 200, secret)
    api.route("POST", SECRETS, 409, status_body(409, "AlreadyExists", "exists",
                                                {"name": "demo-keeper-token"}))  # fmt: skip
    api.route("POST", PYTORCHJOBS, 201, created_with_uid(api))
    for path in KEEPER_JOB_COMPANIONS:
        if path != SECRETS:
            api.route("POST", path, 201, echo(api))
    code, out, err = run(SUBMIT, capsys)
    assert code == 0, err
    assert "secret/demo-keeper-token kept in team; it exists already" in out
    assert "deployment/demo-keeper created in team; owned by pytorchjob/demo" in out
    value = secret["data"][C.KEEPER_TOKEN_KEY]
    assert value not in out + err and "s3cr3t" not in out + err


def test_a_keeper_secret_an_earlier_job_owns_stops_the_submission(api, capsys) -> None:
    """It goes with that job: the new pods would lose their secret."""
    api.route("GET", f"{SECRETS}/demo-keeper-token", 200, existing_secret(owned=True))
    api.route("POST", PYTORCHJOBS, 201, created_with_uid(api))
    code, _, err = run(SUBMIT, capsys)
    assert code == CLUSTER_ERROR, err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "belongs to an earlier job of this name" in line and "submit again" in line
    assert api.calls("POST") == []  # nothing made: the job did not start with it


def test_the_secret_made_for_the_job_is_in_no_line_of_any_command(api, capsys) -> None:
    api.route("POST", PYTORCHJOBS, 201, created_with_uid(api))
    for path in KEEPER_JOB_COMPANIONS:
        api.route("POST", path, 201, echo(api))
    code, out, err = run(SUBMIT, capsys)
    assert code == 0, err
    (post,) = [p for p in api.calls("POST") if p["path"] == SECRETS]
    token = post["body"]["data"][C.KEEPER_TOKEN_KEY]
    raw = base64.b64decode(token)
    assert len(raw) == 32
    said = out + err
    for command in (["status", "demo"], ["delete", "demo"], ["diagnose", "demo"]):
        said += "".join(run(command, capsys)[1:])
    assert token not in said and raw.hex() not in said
    assert raw.decode("latin-1") not in said


def test_a_secret_refused_by_validation_is_named_without_its_value(tmp_path, capsys) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: demo-keeper-token\n"
        "data:\n  token: [hunter2-value]\n"
    )
    code, out, err = run(["validate", str(manifest), "--validate-against", "offline"], capsys)
    assert code == 1
    (problem,) = [line for line in (out + err).splitlines() if "data.token" in line]
    assert "must be of type" in problem and "not shown" in problem
    assert "hunter2" not in out + err
