"""The Helm chart, rendered by real Helm (helm-python-sdk, Helm v4's Go library):

- `helm lint --strict` passes with every ci/ values file;
- every ci/ values file renders objects that pass `kubeddp validate`'s checks, both against the
  reference CRDs (tests/reference) and offline (Kubeflow SDK models);
- `kubeddp render` with the same settings as a ci/ values file (its options written out here,
  independently of render's mapping) makes the same objects as `helm install` (Helm's labels
  and hooks aside);
- `helm package` makes an archive that loads and renders.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from kubeddp.tools.manifests.k8s_names import (
    CHECKPOINTS_ANNOTATION,
    LABEL_INSTANCE,
    NETWORK_ANNOTATION,
)
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.validate import validate_documents
from tests.helpers import reference
from tests.helpers.chart import CHART, CI_FILES, NAMESPACE, RELEASE, chart, ci_values, render
from tests.helpers.render import render_job, secret_values_masked

REPO = Path(__file__).resolve().parents[2]
CRDS = reference.CRDS
CRD_FILES = {
    "kubeflow.org/v1/PyTorchJob": ("kubeflow.org_pytorchjobs.v1.9.4.yaml", "v1"),
    "trainer.kubeflow.org/v1alpha1/TrainJob": (
        "trainer.kubeflow.org_trainjobs.v2.3.0.yaml",
        "v1alpha1",
    ),
}

pytestmark = pytest.mark.timeout(120)


@functools.cache
def reference_crd_schemas() -> dict[str, dict]:
    schemas = {}
    for key, (file_name, version) in CRD_FILES.items():
        crd = yaml.safe_load(reference.read_text(CRDS / file_name))
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        schemas[key] = served["schema"]["openAPIV3Schema"]
    return schemas


def lint_findings(values: dict[str, Any]) -> list[str]:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    # severity: 1 info, 2 warning, 3 error; --strict fails on warnings
    findings = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return findings + list(report["errors"])


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_lint_strict_passes(values_file: Path) -> None:
    assert lint_findings(ci_values(values_file)) == []


def test_lint_strict_passes_with_defaults() -> None:
    assert lint_findings({}) == []
    assert lint_findings({"nodes": "two"}), "lint cannot fail: not a real check"


def test_ci_files_cover_every_scenario() -> None:
    kinds, features = set(), set()
    for path in CI_FILES:
        values = ci_values(path)
        kinds.add(values.get("kind", "PyTorchJob"))
        features |= {key for key in ("elastic", "gang", "kueue") if key in values}
        if values.get("gpusPerNode", 0) == 0:
            features.add("cpu")
    assert kinds == {kind.chart_kind for kind in KINDS.values()}  # a ci/ file per kind
    assert features == {"elastic", "gang", "kueue", "cpu"}


@pytest.mark.parametrize("crds", ["reference-crds", "offline"])
@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_rendered_objects_pass_kubeddp_validate(values_file: Path, crds: str) -> None:
    docs = render(ci_values(values_file))
    if crds == "reference-crds":
        problems = validate_documents(docs, values_file.name, reference_crd_schemas())
    else:
        problems = validate_documents(docs, values_file.name)
    assert [str(p) for p in problems] == []


# --- `kubeddp render` with a ci/ file's settings == `helm install -f FILE` ---------------------

GPU_TOLERATION = "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]"
INSTANCE_TYPES = (
    '{"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms":'
    ' [{"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",'
    ' "values": ["p4d.24xlarge", "p5.48xlarge"]}]}]}}}'
)
HF_TOKEN = (
    "[{name: HF_TOKEN, valueFrom: {secretKeyRef: {name: hf-token, key: token, optional: true}}}]"
)
# The render options that mean what each ci/ file says (the job name: the release's full name).
CI_ARGV = {
    "cpu-kind-values": [
        "pytorchjob", "--name", "kubeddp-ci", "--nodes", "2", "--gpus-per-node", "0",
        "--nproc-per-node", "cpu", "--image", "kubeddp:cpu", "--image-pull-policy", "IfNotPresent",
        "--cpu", "250m", "--memory", "512Mi", "--cpu-limit", "1", "--memory-limit", "1Gi",
        "--shm-size", "256Mi", "--env", "KUBEDDP_CPU_NPROC=2", "--backoff-limit", "0",
        "--checkpoint-size", "1Gi", "--checkpoint-access-mode", "ReadWriteOnce",
        "--ttl-seconds-after-finished", "600", "--set", "workload.name=regression",
        "--set", "train.max_steps=20", "--set", "train.log_every=5", "--set", "ddp.backend=gloo",
        "--set", "ddp.device=cpu", "--set", "checkpoint.every_steps=10",
    ],
    "elastic-values": [
        "pytorchjob", "--name", "demo-kubeddp", "--elastic", "2:4", "--max-restarts", "10",
        "--nodes", "4", "--gpus-per-node", "4", "--cpu", "16", "--memory", "128Gi",
        "--checkpoint-pvc", "kubeddp-checkpoints", "--set", "checkpoint.every_steps=200",
        "--fabric", "roce", "--fabric-resource", "rdma/ib", "--fabric-devices", "1",
        "--topology-key", "example.com/rack",
    ],
    "gpu-multinode-values": [  # kind auto: helm template sees no cluster, render names none
        "--name", "demo-kubeddp", "--nodes", "4", "--gpus-per-node", "8",
        "--cpu", "32", "--memory", "256Gi", "--memory-limit", "256Gi", "--shm-size", "64Gi",
        "--node-selector", "nvidia.com/gpu.present=true", "--tolerations", GPU_TOLERATION,
        "--affinity", INSTANCE_TYPES, "--priority-class", "training-high",
        "--env", "NCCL_DEBUG=WARN", "--env", "KUBEDDP_RDZV_WAIT_SECONDS=600",
        "--extra-env", HF_TOKEN, "--ttl-seconds-after-finished", "86400",
        "--checkpoint-size", "200Gi", "--storage-class", "standard-rwx",
        "--set", "workload.name=charlm", "--set", "workload.n_layer=6",
        "--set", "workload.n_head=8", "--set", "workload.n_embd=512",
        "--set", "workload.seq_len=256", "--set", "train.epochs=3",
        "--set", "train.batch_size=64", "--set", "train.lr=0.0006",
        "--set", "checkpoint.every_steps=500", "--set", "checkpoint.keep=3",
        "--podmonitor", "--podmonitor-interval", "15s",
        "--podmonitor-label", "release=kube-prometheus-stack", "--dashboard",
        "--fabric", "efa", "--instance-type", "p5.48xlarge",
        "--topology-key", "topology.k8s.aws/network-node-layer-3", "--topology-mode", "preferred",
    ],
    "indexedjob-values": [
        "indexedjob", "--name", "demo-kubeddp", "--nodes", "3", "--gpus-per-node", "1",
        "--backoff-limit", "6", "--ttl-seconds-after-finished", "3600", "--cpu", "4",
        "--memory", "16Gi", "--checkpoint-size", "20Gi", "--checkpoint-access-mode",
        "ReadWriteMany", "--podmonitor", "--fabric", "hostNetwork",
    ],
    "pytorchjob-values": [
        "pytorchjob", "--name", "demo-kubeddp", "--nodes", "2", "--gpus-per-node", "1",
        "--time-limit", "12h",
    ],
    "kueue-values": [  # kind auto, as gpu-multinode-values
        "--name", "demo-kubeddp", "--queue", "team-a", "--nodes", "2",
        "--gpus-per-node", "4", "--cpu", "16", "--memory", "64Gi", "--memory-limit", "64Gi",
        "--topology-key", "cloud.google.com/gce-topology-block",
    ],
    "script-values": [
        "pytorchjob", "--name", "my-train", "--nodes", "2", "--nproc-per-node", "2",
        "--image", "registry.example.com/ml/my-train:1.0", "--image-pull-secret", "regcred",
        "--no-spawns-workers", "--script", "/app/ddp_train.py",
        "--volume", "claim:datasets:/data:ro",
        "--env-from", "secret:s3-credentials", "--env-secret", "HF_TOKEN=hub-credentials:token",
        "--checkpoint-size", "10Gi", "--set", "checkpoint.preempt_grace_seconds=30",
        "--", "--epochs", "3", "--snapshot", "/checkpoints/snapshot.pt", "--lr", "0.05",
    ],
    "trainjob-values": [
        "trainjob", "--name", "demo-kubeddp", "--nodes", "2", "--gpus-per-node", "2",
        "--nproc-per-node", "2", "--cpu", "8", "--memory", "32Gi",
        "--runtime-name", "torch-distributed", "--runtime-kind", "ClusterTrainingRuntime",
        "--create-service-account", "--tolerations", GPU_TOLERATION, "--set", "train.epochs=2",
        "--podmonitor", "--fabric", "infiniband", "--fabric-resource",
        "rdma/hca_shared_devices_a", "--pod-security", "privileged",
    ],
    "volcano-values": [
        "pytorchjob", "--name", "demo-kubeddp", "--nodes", "4", "--gpus-per-node", "8",
        "--gang", "volcano", "--gang-queue", "research", "--priority-class", "training-high",
        "--cpu", "32", "--memory", "256Gi",
    ],
}  # fmt: skip
# More chart values -> options, for the corners the ci/ files do not reach.
MORE_CASES = {
    "indexedjob-env": (  # kubeddp's own KUBEDDP_MASTER_PORT is reserved: not an override
        {"kind": "IndexedJob", "env": {"KUBEDDP_CPU_NPROC": "2", "NCCL_DEBUG": "INFO"}},
        ["indexedjob", "--env", "KUBEDDP_CPU_NPROC=2", "--env", "NCCL_DEBUG=INFO"],
    ),
    "indexedjob-onfailure": (
        {"kind": "IndexedJob", "restartPolicy": "OnFailure", "checkpoints": {"existingClaim": "c"}},
        ["indexedjob", "--restart-policy", "OnFailure", "--checkpoint-pvc", "c"],
    ),
    "policies": (
        {
            "kind": "PyTorchJob",
            "restartPolicy": "OnFailure",
            "backoffLimit": 1,
            "cleanPodPolicy": "All",
            "ttlSecondsAfterFinished": 2_000_000,  # Helm prints big floats as 2e+06 without | int
            "istio": {"optOut": False},
        },
        [
            "pytorchjob", "--restart-policy", "OnFailure", "--backoff-limit", "1",
            "--clean-pod-policy", "All", "--ttl-seconds-after-finished", "2000000",
            "--no-istio-opt-out",
        ],
    ),
    "elastic-nodes": (
        {
            "kind": "PyTorchJob",
            "elastic": {"enabled": True, "minNodes": 1, "maxNodes": 4, "maxRestarts": 7},
            "nodes": 2,
        },
        ["pytorchjob", "--elastic", "1:4", "--max-restarts", "7", "--nodes", "2"],
    ),
    "trainjob-auto": (
        {
            "kind": "TrainJob",
            "nodes": 2,
            "gpusPerNode": 1,
            "nprocPerNode": "auto",
            "serviceAccount": {"name": "trainer"},
        },
        [
            "trainjob", "--nodes", "2", "--gpus-per-node", "1", "--nproc-per-node", "auto",
            "--service-account", "trainer",
        ],
    ),
    "scheduler-plugins": (
        {"kind": "PyTorchJob", "nodes": 3, "gang": {"scheduler": "scheduler-plugins"},
         "priorityClassName": "high"},
        ["pytorchjob", "--nodes", "3", "--gang", "scheduler-plugins", "--priority-class", "high"],
    ),
}  # fmt: skip


def without_labels(node: Any) -> Any:
    """Without labels, nor the instance label a selector names (the NetworkPolicy selects the
    job's pods by their labels): a release's instance is not render's job name."""
    if isinstance(node, dict):
        return {
            key: without_labels(value)
            for key, value in node.items()
            if key not in ("labels", LABEL_INSTANCE)
        }
    if isinstance(node, list):
        return [without_labels(item) for item in node]
    return node


def comparable(doc: dict) -> dict:
    """What must agree: kind, name, spec or data (labels aside); a ConfigMap's parsed config."""
    body = {key: value for key, value in doc.items() if key != "metadata"}
    body["name"] = doc["metadata"]["name"]
    if doc["kind"] == "ConfigMap" and "config.yaml" in doc["data"]:
        body["data"] = {"config.yaml": yaml.safe_load(doc["data"]["config.yaml"])}
    (body,) = secret_values_masked([body])  # every render makes a new keeper secret
    return without_labels(body)


def helm_job_objects(values: dict[str, Any]) -> list[dict]:
    """What `helm install` creates for the job: its objects and its pre-install hook (the
    TrainingRuntime), not the `helm test` Pod."""
    docs = [
        d
        for d in render(values)
        if d["metadata"].get("annotations", {}).get("helm.sh/hook") != "test"
    ]
    return sorted(docs, key=lambda d: (d["kind"], d["metadata"]["name"]))


def render_objects(argv: list[str]) -> list[dict]:
    return sorted(render_job(*argv), key=lambda d: (d["kind"], d["metadata"]["name"]))


def test_every_ci_file_has_its_render_options() -> None:
    assert sorted(CI_ARGV) == sorted(path.stem for path in CI_FILES)


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_render_with_a_ci_files_settings_equals_helm(values_file: Path) -> None:
    expected = helm_job_objects(ci_values(values_file))
    rendered = render_objects(CI_ARGV[values_file.stem])
    assert [comparable(doc) for doc in rendered] == [comparable(doc) for doc in expected]


@pytest.mark.parametrize("case", MORE_CASES)
def test_render_equals_helm_for_more_settings(case: str) -> None:
    values, argv = MORE_CASES[case]
    expected = helm_job_objects({"fullnameOverride": "demo-job", **values})
    rendered = render_objects([*argv, "--name", "demo-job"])
    assert [comparable(doc) for doc in rendered] == [comparable(doc) for doc in expected]


def test_comparison_sees_a_difference() -> None:
    """The comparison is not vacuous: one changed setting makes the objects differ."""
    expected = helm_job_objects({"fullnameOverride": "demo-job", "nodes": 2})
    rendered = render_objects(["pytorchjob", "--name", "demo-job", "--nodes", "3"])
    assert [comparable(doc) for doc in rendered] != [comparable(doc) for doc in expected]


def test_objects_differ_only_in_helms_labels() -> None:
    """Metadata too: Helm's labels and the claim's keep-annotation are all that differ (the
    job's storage and network lines are the same)."""
    helm_docs = helm_job_objects(ci_values(CHART / "ci" / "indexedjob-values.yaml"))
    render_docs = render_objects(CI_ARGV["indexedjob-values"])
    for helm_doc, render_doc in zip(helm_docs, render_docs, strict=True):
        helm_labels = dict(helm_doc["metadata"]["labels"])
        assert helm_labels.pop("helm.sh/chart").startswith("kubeddp-")
        assert helm_labels.pop("app.kubernetes.io/version") == chart().metadata["appVersion"]
        assert helm_labels.pop("app.kubernetes.io/managed-by") == "Helm"
        assert helm_labels.pop("app.kubernetes.io/instance") == RELEASE
        render_labels = dict(render_doc["metadata"]["labels"])
        assert render_labels.pop("app.kubernetes.io/managed-by") == "kubeddp"
        assert render_labels.pop("app.kubernetes.io/instance") == "demo-kubeddp"
        assert helm_labels == render_labels
        annotations = dict(helm_doc["metadata"].get("annotations", {}))
        if helm_doc["kind"] == "PersistentVolumeClaim":
            assert annotations.pop("helm.sh/resource-policy") == "keep"
        render_annotations = render_doc["metadata"].get("annotations", {})
        assert annotations == render_annotations
        assert set(annotations) <= {CHECKPOINTS_ANNOTATION, NETWORK_ANNOTATION}
        for name, line in annotations.items():
            assert line.startswith(
                "Checkpoints: " if name == CHECKPOINTS_ANNOTATION else "Network: "
            )


def test_helm_package_makes_a_chart_that_renders(tmp_path: Path) -> None:
    archive = Path(helm.package(CHART, destination=tmp_path))
    assert archive.name == f"kubeddp-{chart().version}.tgz"
    assert archive.is_file()
    with helm.Chart.load(archive) as packaged:
        assert packaged.metadata["appVersion"] == chart().metadata["appVersion"]
        names = {f["name"] for f in packaged.files}
        assert "values.schema.json" not in names or packaged.schema is not None
        assert not any(name.startswith("ci/") for name in names)
        rendered = packaged.render({"nodes": 2}, name=RELEASE, namespace=NAMESPACE)
    assert any("kind: Job" in text for text in rendered.values())  # kind auto, no cluster


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_helm_test_pod_accepts_the_rendered_trainer_config(values_file: Path, tmp_path: Path):
    """`helm test` runs this script in the image; run it here on the rendered ConfigMap."""
    docs = render(ci_values(values_file))
    (config_map,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")
    ]
    (test_pod,) = [d for d in docs if d["kind"] == "Pod"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = test_pod["spec"]["containers"]
    (job,) = [d for d in docs if d["kind"] in KINDS_OF_JOBS]
    assert container["image"] == first_image(job)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config_map["data"]["config.yaml"])
    command = list(container["command"])
    assert command[:2] == ["python", "-c"]
    script = command[2].replace("/etc/kubeddp/config.yaml", str(config_file))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "trainer config OK" in result.stdout


def test_helm_test_pod_fails_on_a_bad_trainer_config(tmp_path: Path) -> None:
    """The check can fail: a key the schema cannot see (set after install) is caught."""
    (test_pod,) = [d for d in render({}) if d["kind"] == "Pod"]
    config_file = tmp_path / "config.yaml"
    config_file.write_text("train:\n  epochz: 3\n")
    script = test_pod["spec"]["containers"][0]["command"][2]
    script = script.replace("/etc/kubeddp/config.yaml", str(config_file))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "epochz" in result.stderr


KINDS_OF_JOBS = tuple(kind.resource.kind for kind in KINDS.values())


def first_image(node: Any) -> str | None:
    """The first `image:` in an object (the training container's, or the TrainJob trainer's)."""
    if isinstance(node, dict):
        if isinstance(node.get("image"), str):
            return node["image"]
        node = list(node.values())
    if isinstance(node, list):
        return next((found for item in node if (found := first_image(item))), None)
    return None


NOTES_COMMANDS = {
    "PyTorchJob": [
        "kubectl -n ml get pytorchjob demo-kubeddp",
        "logs -f demo-kubeddp-worker-0",
        "port-forward pod/demo-kubeddp-worker-0 8479:8479",
    ],
    "TrainJob": [
        "kubectl -n ml get trainjob demo-kubeddp",
        "-l jobset.sigs.k8s.io/jobset-name=demo-kubeddp",
        "8479:8479",
    ],
    "IndexedJob": [
        "kubectl -n ml get job demo-kubeddp",
        "-l batch.kubernetes.io/job-name=demo-kubeddp",
        "8479:8479",
    ],
}


@pytest.mark.parametrize("kind", NOTES_COMMANDS)
def test_notes_tell_how_to_follow_the_job(kind: str) -> None:
    rendered = chart().render({"kind": kind}, name=RELEASE, namespace=NAMESPACE)
    notes = rendered["kubeddp/templates/NOTES.txt"]
    for command in NOTES_COMMANDS[kind] + ["helm test demo -n ml"]:
        assert command in notes
    assert "emptyDir" not in notes and "init-pytorch" not in notes  # the defaults need neither


def test_notes_warn_about_a_master_and_lost_checkpoints() -> None:
    values = {
        "kind": "PyTorchJob",
        "pytorchJob": {"masterReplica": True},
        "checkpoints": {"lostOnRetry": True},
    }
    notes = chart().render(values, name=RELEASE, namespace=NAMESPACE)["kubeddp/templates/NOTES.txt"]
    assert "logs -f demo-kubeddp-master-0" in notes
    assert "init-pytorch" in notes and "--pytorch-init-container-template-file" in notes
    assert "every retry starts training from scratch" in notes
