"""Every kind reaches the cluster by `helm install` and by `kubectl apply -f` of what `kubeddp
render` prints, through the API server's admission as it really is (tests/helpers/admission.py:
Trainer v2.3's TrainJob webhook reads the runtime from its informer cache) in the order Helm and
kubectl really send the objects (tests/helpers/helm_install.py, checked here against the order
the helm binaries print).

No pods start: the order and the webhook are pure logic (the emulated cluster runs jobs).
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.helpers import helm_cli, helm_install
from tests.helpers.admission import ApiObjects, Refused, with_trainer
from tests.helpers.chart import CHART, CI_FILES, NAMESPACE, RELEASE, chart, ci_values
from tests.helpers.helm_cli import RELEASES, Release
from tests.helpers.helm_install import HOOK, InstallFailed
from tests.helpers.render import render_job

pytestmark = pytest.mark.timeout(120)
TRAINER_REFUSAL = "specified trainingRuntime must be created before the TrainJob is created"
KINDS = ("PyTorchJob", "TrainJob", "IndexedJob")


def cluster(lag: int = 0) -> ApiObjects:
    return with_trainer(lag, NAMESPACE)


def rendered(values: dict) -> dict[str, str]:
    """The chart's files as Helm's engine renders them for `helm install` (hooks included)."""
    return chart().render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def release(values: dict) -> helm_install.Release:
    return helm_install.split(rendered(values))


CASES = {
    **{f"defaults-{kind}": {"kind": kind} for kind in KINDS},
    "trainjob-2-nodes": {"kind": "TrainJob", "nodes": 2},  # the keeper's Deployment and Service
    **{path.stem: ci_values(path) for path in CI_FILES},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_helm_install_is_admitted(name: str) -> None:
    api = cluster()
    helm_install.install(api, release(CASES[name]))
    kinds = api.created_kinds()
    if "TrainJob" in kinds and "TrainingRuntime" in kinds:
        assert kinds.index("TrainingRuntime") < kinds.index("TrainJob"), kinds


def test_a_runtime_among_the_releases_objects_is_refused_as_helm_orders_them() -> None:
    """What the chart did before its runtime became a hook: Helm creates TrainJob before
    TrainingRuntime (unknown kinds go alphabetically), and Trainer refuses it every time."""
    chart_release = release({"kind": "TrainJob"})
    (runtime_hook,) = [h for h in chart_release.hooks if h.doc["kind"] == "TrainingRuntime"]
    plain = runtime_hook.doc
    del plain["metadata"]["annotations"]
    as_before = helm_install.Release(
        [h for h in chart_release.hooks if h is not runtime_hook],
        helm_install.sort_by_kind([*chart_release.manifests, plain]),
    )
    with pytest.raises(InstallFailed, match=TRAINER_REFUSAL) as failed:
        helm_install.install(cluster(), as_before)
    assert failed.value.doc["kind"] == "TrainJob"
    assert failed.value.refused.code == 403


def test_the_runtime_hook_runs_at_install_only_and_is_replaced_by_a_new_install() -> None:
    """pre-install, before-hook-creation: an upgrade leaves the runtime as installed (a running
    TrainJob works from its snapshot of it); a reinstall after `helm uninstall` (which leaves
    it) replaces it instead of failing on AlreadyExists."""
    (hook,) = [h for h in release({"kind": "TrainJob"}).hooks if h.doc["kind"] == "TrainingRuntime"]
    assert hook.events == ("pre-install",)
    assert hook.delete_policies == ("before-hook-creation",)
    api = cluster()
    helm_install.install(api, release({"kind": "TrainJob"}))
    helm_install.upgrade(api, release({"kind": "TrainJob", "config": {"train": {"epochs": 3}}}))
    assert [m for m, kind, _, o in api.log if kind == "TrainingRuntime" and o != "NotFound"] == [
        "create"
    ]
    for doc in release({"kind": "TrainJob"}).manifests:  # `helm uninstall`: the hook stays
        api.delete(doc)
    helm_install.install(api, release({"kind": "TrainJob"}))
    assert [m for m, kind, _, o in api.log if kind == "TrainingRuntime" and o != "NotFound"] == [
        "create",
        "delete",
        "create",
    ]


def test_an_informer_slower_than_the_install_refuses_it_and_an_upgrade_creates_the_job() -> None:
    """Helm cannot wait for Trainer's cache: when it is slower than the release's other
    creates, the install fails on the TrainJob with Trainer's line. The documented way on:
    `helm upgrade` with the same values creates the TrainJob on the runtime that stayed."""
    api = cluster(lag=100)
    job = release({"kind": "TrainJob"})
    with pytest.raises(InstallFailed, match=TRAINER_REFUSAL):
        helm_install.install(api, job)
    api.later()
    helm_install.upgrade(api, job)
    assert api.created_kinds()[-1] == "TrainJob"


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob", "indexedjob"])
def test_kubectl_apply_of_the_rendered_file_is_admitted(kind: str) -> None:
    docs = render_job(kind, "--name", "demo", "--nodes", "2")
    assert helm_install.kubectl_apply(cluster(), docs) == []


def test_a_second_kubectl_apply_creates_a_trainjob_the_informer_refused() -> None:
    """The rendered file puts the runtime first, but kubectl sends the TrainJob right after it:
    a lagging cache refuses it; the same `kubectl apply -f` again creates it (docs say so)."""
    docs = render_job("trainjob", "--name", "demo")
    api = cluster(lag=100)
    (refused,) = helm_install.kubectl_apply(api, docs)
    assert refused.doc["kind"] == "TrainJob" and TRAINER_REFUSAL in str(refused)
    api.later()
    assert helm_install.kubectl_apply(api, docs) == []
    assert api.created_kinds().count("TrainJob") == 1


def test_a_server_dry_run_of_a_runtime_and_its_trainjob_never_passes() -> None:
    """Why the kind workflow's webhook probe runs a TrainJob on the installed runtime: a dry run
    persists nothing, so the TrainJob's runtime never exists for the webhook."""
    docs = render_job("trainjob", "--name", "demo")
    api = cluster()
    for _ in range(3):
        refused = [d for d in docs if not _dry_run_passes(api, d)]
        assert [d["kind"] for d in refused] == ["TrainJob"]
        api.later()
    probe = render_job("trainjob", "--name", "probe", "--no-own-runtime")
    assert all(_dry_run_passes(api, d) for d in probe)


def _dry_run_passes(api: ApiObjects, doc: dict) -> bool:
    try:
        api.create(doc, dry_run=True)
    except Refused:
        return False
    return True


# --- the model's order is the order the helm binaries print ------------------------------------


@pytest.mark.parametrize("release_", RELEASES, ids=lambda r: f"helm-{r.helm_version}")
@pytest.mark.parametrize("kind", KINDS)
def test_helm_template_prints_the_release_in_the_models_order(
    release_: Release, kind: str, tmp_path
) -> None:
    """`helm template` prints the release's objects in install order, then the hooks: the
    model's order must be that order, and the runtime must be one of the hooks."""
    binary = helm_cli.require(release_, "helm")
    values = {"kind": kind, "nodes": 2}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(binary), "template", RELEASE, str(CHART), "-n", NAMESPACE,
         "-f", str(tmp_path / "values.yaml")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = [d for d in yaml.safe_load_all(done.stdout) if d]
    major = int(release_.helm_version.split(".")[0])
    model = helm_install.split(rendered(values), major)
    released = [d for d in printed if HOOK not in ((d["metadata"].get("annotations")) or {})]
    assert [(d["kind"], d["metadata"]["name"]) for d in released] == [
        (d["kind"], d["metadata"]["name"]) for d in model.manifests
    ]
    hooks = {(d["kind"], d["metadata"]["name"]) for d in printed if d not in released}
    assert hooks == {(h.doc["kind"], h.name) for h in model.hooks}
    if kind == "TrainJob":
        assert ("TrainingRuntime", f"{RELEASE}-kubeddp") in hooks
