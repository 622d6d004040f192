"""The checkpoint keeper as the manifests wire it, for every kind: the job's secret (a Secret the
chart makes once, mounted read-only in the keeper's pod and every training pod), the
NetworkPolicy that admits only the job's training pods, the keeper's placement and resources,
and the training pods' grace period and emptyDir, computed by the chart (templates/_keeper.tpl,
the one place that does those sums) from the constants of trainer/keeper/sizing.py: for any size
the grace period must leave the last send launch plans and no more than a second over, the
emptyDir must hold what the pod keeps, and a constant changed there must reach the chart (the
storage rules' way: test_storage_rules.py)."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.utils import parse_quantity

from kubeddp.tools.generate import chart_files as generate
from kubeddp.tools.manifests import helm_engine
from kubeddp.tools.manifests.chart.render import chart_dir, render_documents
from kubeddp.tools.manifests.helm_engine import merge_values
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.trainer import constants as C
from kubeddp.trainer.keeper import sizing
from tests.helpers import fake_api, helm_cli
from tests.helpers.chart import CHART
from tests.helpers.chart import render as helm_render
from tests.helpers.helm_cli import RELEASES
from tests.helpers.render import pod_templates

pytestmark = pytest.mark.timeout(300)

KIND_NAMES = [kind.chart_kind for kind in KINDS.values()]
TOKEN_FILE = f"{C.KEEPER_TOKEN_DIR}/{C.KEEPER_TOKEN_KEY}"
JOB = "demo"


def objects(values: dict[str, Any], chart: Path | None = None) -> list[dict]:
    """The job's objects (as `kubeddp render` makes them), or a copy `chart`'s."""
    values = merge_values({"fullnameOverride": JOB, "nodes": 2}, values)
    if chart is None:
        return render_documents(values)
    rendered = helm_engine.render(chart, values, name=JOB, namespace=None)
    return [
        doc
        for path, text in rendered.items()
        if path.endswith(".yaml") and "/tests/" not in path
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def one(docs: list[dict], kind: str) -> dict:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def job_of(docs: list[dict]) -> dict:
    (job,) = [doc for doc in docs if doc["kind"] in ("PyTorchJob", "TrainJob", "Job")]
    return job


def keeper_pod(docs: list[dict]) -> dict:
    return one(docs, "Deployment")["spec"]["template"]


def env_of(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def largest_checkpoint(size: str, keep: int) -> float:
    """The largest checkpoint a claim of `size` holds: `keep` committed and one more being
    received (the Kubernetes client's own quantity parser)."""
    return float(parse_quantity(size)) / (keep + 1)


def check_sizes(pod: dict, size: str, keep: int, grace: float) -> None:
    """The pod's grace period leaves launch the send of the largest checkpoint after the save
    (sizing.send_after_signal_seconds, what launch gives its last send), rounded up to a whole
    second; its emptyDir holds the newest fetched, `keep` written, one being written and a
    script's own files, rounded up to a MiB."""
    checkpoint = largest_checkpoint(size, keep)
    seconds = pod["terminationGracePeriodSeconds"]
    left = sizing.send_after_signal_seconds(seconds, grace)
    assert sizing.final_send_seconds(checkpoint) <= left < sizing.final_send_seconds(checkpoint) + 1
    checkpoints = {v["name"]: v for v in pod["volumes"]}["checkpoints"]
    limit = checkpoints["emptyDir"]["sizeLimit"]
    assert checkpoints["emptyDir"] == {"sizeLimit": limit} and limit.endswith("Mi"), limit
    needed = (keep + 2) * checkpoint + sizing.SCRIPT_FILES_BYTES
    assert needed <= int(limit[:-2]) * 2**20 < needed + 2**20, (size, limit)


SIZES = [("10Gi", 3, 60.0), ("1.5Gi", 1, 30.0), ("500M", 5, 60.0), ("3e9", 2, 90.5),
         ("100Gi", 3, 60.0), ("750Mi", 10, 5.0), ("2Ti", 4, 600.0), (".5Ti", 3, 60.0)]  # fmt: skip


@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize(("size", "keep", "grace"), SIZES)
def test_the_grace_period_leaves_launchs_last_send_and_the_empty_dir_holds_the_pods_files(
    kind: str, size: str, keep: int, grace: float
) -> None:
    config = {"checkpoint": {"keep": keep, "preempt_grace_seconds": grace}}
    docs = objects({"kind": kind, "checkpoints": {"size": size}, "config": config})
    for template in pod_templates(job_of(docs)):
        pod = template["spec"]
        check_sizes(pod, size, keep, grace)
        seconds = pod["terminationGracePeriodSeconds"]
        (container,) = pod["containers"]
        env = env_of(container)
        if kind != "TrainJob":  # a TrainJob's env is in its trainer, below
            assert env[C.ENV_TERMINATION_GRACE_SECONDS] == str(seconds)
    if kind == "TrainJob":
        env = env_of(job_of(docs)["spec"]["trainer"])
        assert env[C.ENV_TERMINATION_GRACE_SECONDS] == str(seconds)
    (keeper,) = keeper_pod(docs)["spec"]["containers"]
    assert keeper["resources"] == sizing.keeper_resources()
    assert keeper["args"][keeper["args"].index("--keep") + 1] == str(keep)


def test_a_grace_period_given_is_kept_and_handed_to_launch() -> None:
    docs = objects({"terminationGracePeriodSeconds": 900})
    for template in pod_templates(job_of(docs)):
        assert template["spec"]["terminationGracePeriodSeconds"] == 900
        (container,) = template["spec"]["containers"]
        assert env_of(container)[C.ENV_TERMINATION_GRACE_SECONDS] == "900"
    # without a keeper: the manifests' default, and nothing for launch to plan a send with
    (template,) = pod_templates(job_of(objects({"nodes": 1})))
    assert template["spec"]["terminationGracePeriodSeconds"] == 2 * C.PREEMPT_GRACE_SECONDS
    assert C.ENV_TERMINATION_GRACE_SECONDS not in env_of(template["spec"]["containers"][0])


def chart_from_sizing(tmp_path: Path) -> Path:
    """A copy of the chart whose _constants.tpl is written from keeper_sizing as it is now."""
    copy = tmp_path / "kubeddp"
    shutil.copytree(chart_dir(), copy)
    (copy / "templates" / "_constants.tpl").write_text(generate.constants_tpl())
    return copy


def test_a_constant_changed_in_keeper_sizing_reaches_the_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {"kind": "IndexedJob", "checkpoints": {"size": "40Gi"}}
    before = objects(values, chart_from_sizing(tmp_path / "before"))
    monkeypatch.setattr(sizing, "FLOOR_BYTES_PER_SECOND", 5e6)  # a slower disk planned for
    monkeypatch.setattr(sizing, "KEEPER_MEMORY_MIB", 1024)
    monkeypatch.setattr(sizing, "SCRIPT_FILES_BYTES", 8 * 2**30)
    after = objects(values, chart_from_sizing(tmp_path / "after"))
    (pod,) = [t["spec"] for t in pod_templates(job_of(after))]
    check_sizes(pod, "40Gi", 3, C.PREEMPT_GRACE_SECONDS)
    resources = keeper_pod(after)["spec"]["containers"][0]["resources"]
    assert resources == sizing.keeper_resources()
    assert resources["requests"]["memory"] == "1024Mi"
    assert job_of(before) != job_of(after)  # the constants moved the chart, not a coincidence


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_the_jobs_secret_is_mounted_read_only_in_the_keeper_and_every_training_pod(
    kind: str,
) -> None:
    docs = objects({"kind": kind})
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == f"{JOB}-keeper-token"
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    assert len(base64.b64decode(secret["data"][C.KEEPER_TOKEN_KEY], validate=True)) == 32
    # what `kubeddp submit` knows it by (it creates it only when absent)
    assert secret["metadata"]["labels"]["app.kubernetes.io/component"] == "checkpoint-keeper"
    keeper = keeper_pod(docs)["spec"]
    (container,) = keeper["containers"]
    args = container["args"]
    assert args[args.index("--token-file") + 1] == TOKEN_FILE
    assert env_of(container)[C.ENV_CHECKPOINT_KEEPER_TOKEN_FILE] == TOKEN_FILE
    for pod in [keeper, *(t["spec"] for t in pod_templates(job_of(docs)))]:
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["keeper-token"]["secret"] == {
            "secretName": f"{JOB}-keeper-token",
            "items": [{"key": C.KEEPER_TOKEN_KEY, "path": C.KEEPER_TOKEN_KEY}],
        }
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["keeper-token"] == {
            "name": "keeper-token",
            "mountPath": C.KEEPER_TOKEN_DIR,
            "readOnly": True,
        }
    env = env_of(job_of(docs)["spec"]["trainer"]) if kind == "TrainJob" else None
    for template in pod_templates(job_of(docs)):
        env = env or env_of(template["spec"]["containers"][0])
        assert env[C.ENV_CHECKPOINT_KEEPER_TOKEN_FILE] == TOKEN_FILE
    # a Secret of the user's: none rendered, the pods read theirs
    docs = objects({"kind": kind, "keeper": {"existingSecret": "team-keeper"}})
    assert [d for d in docs if d["kind"] == "Secret"] == []
    volumes = {v["name"]: v for v in keeper_pod(docs)["spec"]["volumes"]}
    assert volumes["keeper-token"]["secret"]["secretName"] == "team-keeper"


def selects(selector: dict, labels: dict) -> bool:
    """A NetworkPolicy's podSelector (matchLabels; kubeddp writes no expressions) on labels."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_the_network_policy_admits_the_jobs_training_pods_only(kind: str) -> None:
    docs = objects({"kind": kind})
    policy = one(docs, "NetworkPolicy")["spec"]
    keeper = keeper_pod(docs)["metadata"]["labels"]
    trainers = [t["metadata"]["labels"] for t in pod_templates(job_of(docs))]
    other_job = [t["metadata"]["labels"] for t in pod_templates(job_of(render_documents(
        merge_values({"fullnameOverride": "other", "nodes": 2}, {"kind": kind}))))]  # fmt: skip
    # `helm test`'s pod runs the image too, and is not the job's
    test_pod = [d for d in helm_render({"kind": kind, "nodes": 2}) if d["kind"] == "Pod"]
    assert selects(policy["podSelector"], keeper)
    assert not any(selects(policy["podSelector"], labels) for labels in trainers)
    assert policy["policyTypes"] == ["Ingress"]
    ((rule),) = policy["ingress"]
    ((peer),) = rule["from"]
    assert set(peer) == {"podSelector"}  # no namespaceSelector: the job's namespace only
    assert all(selects(peer["podSelector"], labels) for labels in trainers)
    assert not selects(peer["podSelector"], keeper)
    assert not any(selects(peer["podSelector"], labels) for labels in other_job)
    assert test_pod and not selects(peer["podSelector"], test_pod[0]["metadata"]["labels"])
    (port,) = keeper_pod(docs)["spec"]["containers"][0]["ports"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port["containerPort"]}]
    assert port["containerPort"] == C.KEEPER_PORT
    off = objects({"kind": kind, "keeper": {"networkPolicy": False}})
    assert [d for d in off if d["kind"] == "NetworkPolicy"] == []


TAINT = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In",
                                                 "values": ["train"]}]}]}}}  # fmt: skip


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_the_keeper_schedules_where_the_job_does_unless_told_otherwise(kind: str) -> None:
    placement = {"nodeSelector": {"pool": "train"}, "tolerations": TAINT, "affinity": AFFINITY}
    if kind != "TrainJob":  # Trainer's runtimePatches cannot carry it (refused for the job)
        placement["priorityClassName"] = "training"
    pod = keeper_pod(objects({"kind": kind, **placement}))["spec"]
    assert {key: pod[key] for key in placement} == placement
    resources = pod["containers"][0]["resources"]
    assert set(resources) == {"requests", "limits"}  # a ResourceQuota on limits admits it
    assert set(resources["limits"]) == {"cpu", "memory"}
    own = {"nodeSelector": {}, "tolerations": [{"key": "keeper", "operator": "Exists"}],
           "priorityClassName": "low", "resources": {"requests": {"cpu": "2"}}}  # fmt: skip
    pod = keeper_pod(objects({"kind": kind, **placement, "keeper": own}))["spec"]
    assert "nodeSelector" not in pod  # {}: none, not the job's
    assert pod["tolerations"] == own["tolerations"] and pod["priorityClassName"] == "low"
    assert pod["affinity"] == AFFINITY  # not overridden: the job's
    assert pod["containers"][0]["resources"] == own["resources"]


def serve_discovery(api: fake_api.FakeApiServer, docs: list[dict]) -> None:
    """What Helm asks a cluster before a server dry run: its version and the resources of
    each kind it will create (Helm 4 maps every object; Helm 3 only what lookup reads)."""
    api.route("GET", "/version", 200, {"major": "1", "minor": "33", "gitVersion": "v1.33.1"})
    groups: dict[str, list[dict]] = {}
    for doc in docs:
        plural = doc["kind"].lower() + ("es" if doc["kind"].endswith("s") else "s")
        groups.setdefault(doc["apiVersion"], []).append(
            {"name": plural, "singularName": doc["kind"].lower(), "namespaced": True,
             "kind": doc["kind"], "verbs": ["get", "create"]}
        )  # fmt: skip
    for version, resources in groups.items():
        path = f"/api/{version}" if "/" not in version else f"/apis/{version}"
        body = {"kind": "APIResourceList", "groupVersion": version, "resources": resources}
        api.route("GET", path, 200, body)
    api.route("GET", "/api", 200, {"kind": "APIVersions", "versions": ["v1"]})
    named = [v for v in groups if "/" in v]
    api.route(
        "GET",
        "/apis",
        200,
        {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": v.split("/")[0],
                    "versions": [{"groupVersion": v, "version": v.split("/")[1]}],
                    "preferredVersion": {"groupVersion": v, "version": v.split("/")[1]},
                }
                for v in named
            ],
        },
    )


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: f"helm-{r.helm_version}")
def test_helm_keeps_the_secret_a_running_job_uses(release, tmp_path: Path) -> None:
    """`helm upgrade` renders with the cluster at hand: the chart's lookup finds the Secret
    and keeps its value (here `helm template --dry-run=server` against the fake API server,
    which holds the Secret); without a cluster a new value is made each time."""
    helm = str(helm_cli.require(release, "helm"))
    kept = base64.b64encode(b"k" * 32).decode()
    name = "demo-kubeddp-keeper-token"  # release demo's full name
    with fake_api.running() as api:
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", api.url)
        serve_discovery(api, objects({"kind": "PyTorchJob"}))
        installed = {  # as the release's install made it
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "demo",
                            "meta.helm.sh/release-namespace": "team"},
        }  # fmt: skip
        api.route("GET", f"/api/v1/namespaces/team/secrets/{name}", 200,
                  {"apiVersion": "v1", "kind": "Secret", "metadata": installed,
                   "data": {C.KEEPER_TOKEN_KEY: kept}})  # fmt: skip
        tokens = []
        # (no OpenAPI document here for Helm 4 to check the objects against: test_chart_* do)
        server = [
            "--dry-run=server",
            "--disable-openapi-validation",
            "--kubeconfig",
            str(kubeconfig),
        ]
        for cluster in (server, []):
            done = subprocess.run(
                [helm, "template", "demo", str(CHART), "-n", "team", "--set", "nodes=2", *cluster],
                capture_output=True, text=True, timeout=120, check=False,
                env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            (secret,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Secret"]
            tokens.append(secret["data"][C.KEEPER_TOKEN_KEY])
    assert tokens[0] == kept
    assert tokens[1] != kept and len(base64.b64decode(tokens[1])) == 32


def test_the_docs_give_the_charts_grace_periods() -> None:
    """docs/checkpoints.md states the sum and two of its results: they are the chart's (a
    constant changed in sizing.py, or a sum changed in _keeper.tpl, must reach the page)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md").read_text()
    page = " ".join(page.split())
    s = sizing
    formula = (
        f"preempt grace + {s.SHUTDOWN_MARGIN_SECONDS:g} s + {s.SEND_SLACK_SECONDS:g} s + size / "
        f"{s.FLOOR_BYTES_PER_SECOND / 1e6:g} MB/s + {s.KILL_MARGIN_SECONDS:g} s"
    )
    assert formula in page
    for gib, said in ((4, "277 s for a 4 GiB checkpoint"), (10, "535 s for 10 GiB")):
        values = {"kind": "IndexedJob", "checkpoints": {"size": f"{4 * gib}Gi"}}  # keep 3: /4
        (pod,) = [t["spec"] for t in pod_templates(job_of(objects(values)))]
        assert said in page and said.startswith(f"{pod['terminationGracePeriodSeconds']} s ")
