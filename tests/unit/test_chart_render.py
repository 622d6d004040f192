"""The Helm chart, rendered by real Helm (helm-python-sdk, Helm v4's Go library):

- `helm lint --strict` passes with every ci/ values file;
- every ci/ values file renders objects that pass `kubeddp validate`'s checks, both against the
  reference CRDs in ../shared/reference and offline (Kubeflow SDK models);
- the job the chart renders equals the one `kubeddp render` (tools/manifests.py) builds for the
  same settings, field by field (labels aside);
- `helm package` makes an archive that loads and renders.
"""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from kubeddp.tools.jobspec import JobSpec, check_spec
from kubeddp.tools.manifests import build_manifests
from kubeddp.tools.validate import validate_documents

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubeddp"
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
CRDS = REPO / ".." / "shared" / "reference" / "crds"
CRD_FILES = {
    "kubeflow.org/v1/PyTorchJob": ("kubeflow.org_pytorchjobs.v1.9.4.yaml", "v1"),
    "trainer.kubeflow.org/v1alpha1/TrainJob": (
        "trainer.kubeflow.org_trainjobs.v2.3.0.yaml",
        "v1alpha1",
    ),
}
KINDS = {"PyTorchJob": "pytorchjob", "TrainJob": "trainjob", "IndexedJob": "indexedjob"}
RELEASE = "demo"
NAMESPACE = "ml"

pytestmark = pytest.mark.timeout(120)


@functools.cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def ci_values(path: Path) -> dict[str, Any]:
    return helm.values_from_yaml(path.read_text())  # what `helm -f FILE` reads


def render(values: dict[str, Any]) -> list[dict]:
    """The release's objects (NOTES.txt and empty templates dropped), hooks included."""
    rendered = chart().render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


@functools.cache
def reference_crd_schemas() -> dict[str, dict]:
    schemas = {}
    for key, (file_name, version) in CRD_FILES.items():
        crd = yaml.safe_load((CRDS / file_name).read_text())
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
    assert kinds == set(KINDS)
    assert features == {"elastic", "gang", "kueue", "cpu"}


@pytest.mark.parametrize("crds", ["reference-crds", "offline"])
@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_rendered_objects_pass_kubeddp_validate(values_file: Path, crds: str) -> None:
    docs = render(ci_values(values_file))
    if crds == "reference-crds":
        if not CRDS.is_dir():
            pytest.skip(f"reference CRDs not at {CRDS}")
        problems = validate_documents(docs, values_file.name, reference_crd_schemas())
    else:
        problems = validate_documents(docs, values_file.name)
    assert [str(p) for p in problems] == []


# --- chart values -> the JobSpec `kubeddp render` takes --------------------------------------


def job_spec(values: dict[str, Any]) -> JobSpec:
    """The `kubeddp render` options that mean the same as these chart values."""
    merged = chart().merge_values(values)  # null values are left out
    resources = merged["resources"]
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    checkpoints = merged["checkpoints"]
    elastic = merged["elastic"]
    service_account = merged["serviceAccount"]["name"] or (
        merged["fullnameOverride"] if merged["serviceAccount"]["create"] else None
    )
    image_tag = merged["image"]["tag"] or chart().metadata["appVersion"]
    spec = JobSpec(
        kind=KINDS[merged["kind"]],
        name=merged["fullnameOverride"],
        image=f"{merged['image']['repository']}:{image_tag}",
        image_pull_policy=merged["image"]["pullPolicy"],
        nodes=merged.get("nodes"),
        nproc_per_node=None if merged.get("nprocPerNode") is None else str(merged["nprocPerNode"]),
        gpus_per_node=merged["gpusPerNode"],
        elastic=(elastic["minNodes"], elastic["maxNodes"]) if elastic["enabled"] else None,
        max_restarts=elastic["maxRestarts"],
        cpu=requests.get("cpu"),
        memory=requests.get("memory"),
        cpu_limit=limits.get("cpu"),
        memory_limit=limits.get("memory"),
        shm_size=merged["shmSize"],
        checkpoint_claim=checkpoints["existingClaim"] or None,
        checkpoint_size=checkpoints["size"] or None,
        storage_class=checkpoints["storageClassName"] or None,
        checkpoint_access_mode=checkpoints["accessMode"],
        trainer_config=copy.deepcopy(merged["config"]),
        env={key: str(merged["env"][key]) for key in sorted(merged["env"])},
        node_selector=merged["nodeSelector"],
        tolerations=merged["tolerations"],
        affinity=merged["affinity"] or None,
        priority_class=merged["priorityClassName"] or None,
        queue=merged["kueue"]["queueName"] or None,
        gang=merged["gang"]["scheduler"] or None,
        restart_policy=merged.get("restartPolicy"),
        backoff_limit=merged.get("backoffLimit"),
        ttl_seconds_after_finished=merged.get("ttlSecondsAfterFinished"),
        clean_pod_policy=merged.get("cleanPodPolicy"),
        istio_opt_out=merged["istio"]["optOut"],
        service_account=service_account,
        podmonitor=merged["monitoring"]["podMonitor"]["enabled"],
        podmonitor_labels=merged["monitoring"]["podMonitor"]["labels"],
    )
    check_spec(spec)
    return spec


def add_chart_only_settings(docs: list[dict], values: dict[str, Any]) -> list[dict]:
    """Knobs the chart has beyond `kubeddp render`: add them to the renderer's objects."""
    merged = chart().merge_values(values)
    for doc in docs:
        if doc["kind"] == "PodMonitor" and merged["monitoring"]["podMonitor"]["interval"]:
            doc["spec"]["podMetricsEndpoints"][0]["interval"] = merged["monitoring"]["podMonitor"][
                "interval"
            ]
        if doc["kind"] == "PyTorchJob" and merged["gang"]["queue"]:
            doc["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = merged["gang"]["queue"]
        for container in containers(doc):
            if merged["extraEnv"]:
                container.setdefault("env", []).extend(copy.deepcopy(merged["extraEnv"]))
    return docs


def containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc["kind"] == "PyTorchJob":
        return [
            c
            for r in spec["pytorchReplicaSpecs"].values()
            for c in r["template"]["spec"]["containers"]
        ]
    if doc["kind"] == "Job":
        return spec["template"]["spec"]["containers"]
    if doc["kind"] == "TrainJob":
        return [spec["trainer"]]
    return []


def without_labels(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: without_labels(value) for key, value in node.items() if key != "labels"}
    if isinstance(node, list):
        return [without_labels(item) for item in node]
    return node


def comparable(doc: dict) -> dict:
    """What must agree: name, kind, spec (labels aside); a ConfigMap's parsed config file."""
    body = {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "name": doc["metadata"]["name"]}
    if doc["kind"] == "ConfigMap":
        body["data"] = {key: yaml.safe_load(text) for key, text in doc["data"].items()}
    else:
        body["spec"] = without_labels(doc["spec"])
    return body


def chart_job_objects(values: dict[str, Any]) -> list[dict]:
    """The chart's objects that `kubeddp render` also makes (not the ServiceAccount, the helm
    test Pod or the Grafana dashboard)."""
    docs = render(values)
    return [
        doc
        for doc in docs
        if doc["kind"] not in ("ServiceAccount", "Pod")
        and not doc["metadata"]["name"].endswith("-dashboard")
    ]


COMPARED_CASES = {
    "defaults": {},
    "two-gpu-nodes": {"nodes": 2, "gpusPerNode": 2},
    "elastic": {"elastic": {"enabled": True, "minNodes": 2, "maxNodes": 3}, "gpusPerNode": 1},
    "elastic-nodes": {
        "elastic": {"enabled": True, "minNodes": 1, "maxNodes": 4, "maxRestarts": 7},
        "nodes": 2,
    },
    "trainjob": {"kind": "TrainJob", "nodes": 3},
    "trainjob-auto": {
        "kind": "TrainJob",
        "nodes": 2,
        "gpusPerNode": 1,
        "nprocPerNode": "auto",
        "serviceAccount": {"name": "trainer"},
    },
    "indexedjob": {"kind": "IndexedJob", "nodes": 2, "env": {"B": "2", "A": "1"}},
    "indexedjob-env-override": {
        "kind": "IndexedJob",
        "env": {"KUBEDDP_MASTER_PORT": "29600", "NCCL_DEBUG": "INFO"},
    },
    "indexedjob-onfailure": {
        "kind": "IndexedJob",
        "restartPolicy": "OnFailure",
        "backoffLimit": 0,
        "checkpoints": {"existingClaim": "ckpt"},
    },
    "policies": {
        "restartPolicy": "OnFailure",
        "backoffLimit": 1,
        "cleanPodPolicy": "All",
        "ttlSecondsAfterFinished": 2_000_000,  # Helm prints big floats as 2e+06 without | int
        "istio": {"optOut": False},
    },
    "scheduler-plugins": {
        "nodes": 3,
        "gang": {"scheduler": "scheduler-plugins"},
        "priorityClassName": "high",
    },
    "config": {
        "config": {"train": {"lr": 0.001, "epochs": 2}, "checkpoint": {"dir": "/checkpoints/run1"}}
    },
}
COMPARED_CASES.update({f"ci-{path.stem}": ci_values(path) for path in CI_FILES})


@pytest.mark.parametrize("case", COMPARED_CASES)
def test_chart_job_equals_kubeddp_render(case: str) -> None:
    values = {"fullnameOverride": "demo-job", **COMPARED_CASES[case]}
    if "fullnameOverride" in COMPARED_CASES[case]:
        values["fullnameOverride"] = COMPARED_CASES[case]["fullnameOverride"]
    expected = add_chart_only_settings(build_manifests(job_spec(values)), values)
    rendered = chart_job_objects(values)
    assert [comparable(doc) for doc in rendered] == [
        comparable(doc) for doc in sorted_like(expected, rendered)
    ]


def sorted_like(expected: list[dict], rendered: list[dict]) -> list[dict]:
    """The renderer's objects in the chart's order (Helm sorts by template file name)."""
    order = {(doc["kind"], doc["metadata"]["name"]): i for i, doc in enumerate(rendered)}
    missing = [
        (d["kind"], d["metadata"]["name"])
        for d in expected
        if (d["kind"], d["metadata"]["name"]) not in order
    ]
    assert not missing, f"the chart does not render {missing}"
    return sorted(expected, key=lambda d: order[(d["kind"], d["metadata"]["name"])])


def test_comparison_sees_a_difference() -> None:
    """The comparison is not vacuous: one changed knob makes the objects differ."""
    values = {"fullnameOverride": "demo-job", "nodes": 2}
    expected = build_manifests(job_spec({**values, "nodes": 3}))
    rendered = chart_job_objects(values)
    assert [comparable(doc) for doc in rendered] != [
        comparable(doc) for doc in sorted_like(expected, rendered)
    ]


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
    assert any("kind: PyTorchJob" in text for text in rendered.values())


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
    assert container["image"] == containers(job)[0]["image"]
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


KINDS_OF_JOBS = ("PyTorchJob", "TrainJob", "Job")
NOTES_COMMANDS = {
    "PyTorchJob": [
        "kubectl -n ml get pytorchjob demo-kubeddp",
        "logs -f demo-kubeddp-master-0",
        "port-forward pod/demo-kubeddp-master-0 9400:9400",
    ],
    "TrainJob": [
        "kubectl -n ml get trainjob demo-kubeddp",
        "-l jobset.sigs.k8s.io/jobset-name=demo-kubeddp",
        "9400:9400",
    ],
    "IndexedJob": [
        "kubectl -n ml get job demo-kubeddp",
        "-l batch.kubernetes.io/job-name=demo-kubeddp",
        "9400:9400",
    ],
}


@pytest.mark.parametrize("kind", NOTES_COMMANDS)
def test_notes_tell_how_to_follow_the_job(kind: str) -> None:
    rendered = chart().render({"kind": kind}, name=RELEASE, namespace=NAMESPACE)
    notes = rendered["kubeddp/templates/NOTES.txt"]
    for command in NOTES_COMMANDS[kind] + ["helm test demo -n ml"]:
        assert command in notes
