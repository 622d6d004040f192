"""network.fabric and placement through `kubeddp render` (the chart, rendered by Helm's engine):
each profile adds to the training pod of every kind what its provider documents and nothing
else, and the objects pass the strict schemas; render names the Pod Security level the pods
need; placement lands as Kueue's topology annotation or as a pod affinity among the job's
training pods (docs/network-fabric.md). The refusals are rows of tests/helpers/chart_refusals.py
and tests/helpers/bad_inputs.py; Helm and render agree on the ci/ files that set them."""

from __future__ import annotations

from typing import Any

import pytest

from kubeddp.tools.cli.main import parse_command
from kubeddp.tools.manifests.chart import fabric
from kubeddp.tools.manifests.chart.render import RenderError, render_documents
from kubeddp.tools.manifests.chart.render_options import values_from_args
from kubeddp.tools.manifests.k8s_names import KUEUE_TOPOLOGY_ANNOTATIONS
from kubeddp.tools.manifests.validate import validate_documents
from kubeddp.trainer.constants import ENV_NETWORK_FABRIC
from tests.helpers.render import pod_templates

pytestmark = pytest.mark.timeout(120)

KINDS_ARGV = {
    "pytorchjob": ("pytorchjob",),
    "elastic": ("pytorchjob", "--elastic", "1:2"),
    "indexedjob": ("indexedjob",),
    "trainjob": ("trainjob",),
}
# profile -> (its options, the resource and count each pod must request; None: none)
PROFILES: dict[str, tuple[tuple[str, ...], tuple[str, str] | None]] = {
    "socket": ((), None),
    "efa": (("--fabric", "efa", "--instance-type", "p4d.24xlarge"), (fabric.EFA_RESOURCE, "4")),
    "infiniband": (
        ("--fabric", "infiniband", "--fabric-resource", "rdma/hca_shared_devices_a"),
        ("rdma/hca_shared_devices_a", "1"),
    ),
    "roce": (
        ("--fabric", "roce", "--fabric-resource", "rdma/ib", "--fabric-devices", "2"),
        ("rdma/ib", "2"),
    ),
    "hostNetwork": (("--fabric", "hostNetwork"), None),
}
GPUS = "8"


def render(*argv: str) -> tuple[list[dict], list[str]]:
    notes: list[str] = []
    args = parse_command(["render", *argv, "--name", "demo", "--nodes", "2"])
    return render_documents(*values_from_args(args), notes=notes), notes


def job_of(docs: list[dict]) -> dict:
    (job,) = [d for d in docs if d["kind"] in ("PyTorchJob", "TrainJob", "Job")]
    return job


def training_pod(job: dict) -> tuple[dict, dict]:
    """(the pod spec, the training container with its env and resources) of any kind: a
    TrainJob carries env and resources in spec.trainer, the rest in its runtimePatches."""
    spec = pod_templates(job)[-1]["spec"]
    container = dict(spec["containers"][0])
    if job["kind"] == "TrainJob":
        trainer = job["spec"]["trainer"]
        container.update(env=trainer.get("env", []), resources=trainer["resourcesPerNode"])
    return spec, container


def env_of(container: dict) -> dict[str, Any]:
    return {entry["name"]: entry.get("value") for entry in container.get("env", [])}


CASES = [
    (kind, profile)
    for kind in KINDS_ARGV
    for profile in PROFILES
    if not (kind == "trainjob" and profile == fabric.HOST_NETWORK)  # refused: chart_refusals
]


@pytest.mark.parametrize(("kind", "profile"), CASES, ids=lambda item: item)
def test_each_profile_adds_what_its_provider_documents(kind: str, profile: str) -> None:
    options, device = PROFILES[profile]
    docs, notes = render(*KINDS_ARGV[kind], "--gpus-per-node", GPUS, *options)
    assert [str(p) for p in validate_documents(docs, f"{kind}-{profile}")] == []
    spec, container = training_pod(job_of(docs))
    resources = container["resources"]
    for section in ("requests", "limits"):
        extended = {k: v for k, v in resources[section].items() if "/" in k}
        assert extended == {"nvidia.com/gpu": GPUS, **dict([device] if device else [])}
    assert env_of(container).get(ENV_NETWORK_FABRIC) == (None if profile == "socket" else profile)
    added = container["securityContext"].get("capabilities", {}).get("add", [])
    rdma = profile in ("infiniband", "roce")
    assert added == ([fabric.RDMA_CAPABILITY] if rdma else [])
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    host = profile == fabric.HOST_NETWORK
    assert spec.get("hostNetwork", False) is host
    assert spec.get("dnsPolicy") == (fabric.HOST_NETWORK_DNS_POLICY if host else None)
    network_lines = [line for line in notes if line.startswith("Network:")]
    if profile == "socket":
        assert network_lines == []
    else:
        (line,) = network_lines
        assert f"Pod Security level {fabric.LEVEL_NEEDED[profile]}" in line


def test_efa_without_its_instance_type_requests_one_adapter_and_says_so() -> None:
    docs, notes = render("pytorchjob", "--fabric", "efa")
    _, container = training_pod(job_of(docs))
    assert container["resources"]["limits"] == {fabric.EFA_RESOURCE: "1"}
    (line,) = [line for line in notes if line.startswith("Network:")]
    assert "network.instanceType and network.devices not set" in line


def test_a_declared_level_that_admits_the_pods_is_named() -> None:
    _, notes = render("pytorchjob", "--fabric", "infiniband", "--fabric-resource", "rdma/ib",
                      "--pod-security", "privileged")  # fmt: skip
    (line,) = [line for line in notes if line.startswith("Network:")]
    assert line.endswith("(podSecurityLevel privileged).")


def test_a_count_of_the_fabric_resource_in_resources_is_refused_not_replaced() -> None:
    """Two counts of one device (the fabric's and the user's) were one silently replaced."""
    one = '{"limits": {"rdma/ib": "1"}}'
    with pytest.raises(RenderError, match=r"rdma/ib is also in resources\.limits: the fabric's"):
        render("pytorchjob", "--fabric", "roce", "--fabric-resource", "rdma/ib",
               "--fabric-devices", "3", "--resources", one)  # fmt: skip


def test_a_capability_the_user_adds_is_kept_once() -> None:
    context = '{"capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK", "NET_RAW"]}}'
    docs, _ = render("pytorchjob", "--fabric", "roce", "--fabric-resource", "rdma/ib",
                     "--security-context", context)  # fmt: skip
    _, container = training_pod(job_of(docs))
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK", "NET_RAW"]


# --- placement ------------------------------------------------------------------------------

BLOCK = "cloud.google.com/gce-topology-block"
NODE_AFFINITY = (
    '{"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms":'
    ' [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]}}}'
)


@pytest.mark.parametrize("kind", KINDS_ARGV)
def test_required_placement_is_a_pod_affinity_among_the_jobs_training_pods(kind: str) -> None:
    docs, _ = render(*KINDS_ARGV[kind], "--topology-key", BLOCK, "--affinity", NODE_AFFINITY)
    assert [str(p) for p in validate_documents(docs, kind)] == []
    template = pod_templates(job_of(docs))[-1]
    affinity = template["spec"]["affinity"]
    assert "nodeAffinity" in affinity  # the user's affinity is kept
    (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == BLOCK
    selector = term["labelSelector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()  # selects its own pods
    assert selector["app.kubernetes.io/component"] == "trainer"  # not the keeper
    assert selector["app.kubernetes.io/instance"] == "demo"  # not another job's
    for doc in docs:  # the keeper (and anything else) is not placed with the job
        if doc["kind"] == "Deployment":
            assert "podAffinity" not in doc["spec"]["template"]["spec"].get("affinity", {})


def test_preferred_placement_is_a_weighted_pod_affinity() -> None:
    docs, _ = render("pytorchjob", "--topology-key", "rack", "--topology-mode", "preferred")
    affinity = pod_templates(job_of(docs))[-1]["spec"]["affinity"]["podAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
    (weighted,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert weighted["weight"] == 100 and weighted["podAffinityTerm"]["topologyKey"] == "rack"


@pytest.mark.parametrize("mode", ["required", "preferred"])
def test_with_a_kueue_queue_placement_is_kueues_topology_annotation(mode: str) -> None:
    docs, _ = render("pytorchjob", "--queue", "team-a", "--topology-key", BLOCK,
                     "--topology-mode", mode)  # fmt: skip
    template = pod_templates(job_of(docs))[-1]
    annotations = template["metadata"]["annotations"]
    assert annotations[KUEUE_TOPOLOGY_ANNOTATIONS[mode]] == BLOCK
    others = set(KUEUE_TOPOLOGY_ANNOTATIONS.values()) - {KUEUE_TOPOLOGY_ANNOTATIONS[mode]}
    assert not others & set(annotations)
    assert "podAffinity" not in template["spec"].get("affinity", {})  # Kueue places the pods
