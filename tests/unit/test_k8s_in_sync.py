"""k8s/ holds exactly what `make k8s` (python -m kubeddp.tools.generate.k8s_manifests) renders, and
it is valid."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from kubeddp.tools.cluster.kube import resource_for
from kubeddp.tools.generate import k8s_manifests as gen_k8s
from kubeddp.tools.manifests.k8s_names import IMAGE_CPU_LOCAL
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.rbac import RULES
from kubeddp.tools.manifests.validate import load_documents, validate_documents
from tests.helpers.render import render_job

K8S = Path(__file__).resolve().parents[2] / "k8s"


def test_checked_in_manifests_match_a_fresh_render(capsys):
    code = gen_k8s.main(["--out", str(K8S), "--check"])
    diff = capsys.readouterr().out
    assert code == 0, f"k8s/ is stale; run `make k8s`:\n{diff}"
    assert sorted(p.name for p in K8S.glob("*.yaml")) == sorted(gen_k8s.generated_files())


def test_check_fails_on_a_hand_edit(tmp_path, capsys):
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    target = copy / "pytorchjob-gpu.yaml"
    target.write_text(target.read_text().replace("replicas: 2", "replicas: 3", 1))
    assert gen_k8s.main(["--out", str(copy), "--check"]) == 1
    assert "pytorchjob-gpu.yaml" in capsys.readouterr().out


def test_every_checked_in_manifest_validates():
    for path in sorted(K8S.glob("*.yaml")):
        docs = load_documents(path.read_text(), path.name)
        assert validate_documents(docs, path.name) == [], path


def test_kind_ci_job_uses_the_local_cpu_image_and_gloo():
    docs = load_documents((K8S / "pytorchjob-cpu-gloo.yaml").read_text(), "cpu")
    job = next(d for d in docs if d["kind"] == "PyTorchJob")
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = replica["template"]["spec"]["containers"]
        assert container["image"] == IMAGE_CPU_LOCAL
        assert container["imagePullPolicy"] == "IfNotPresent"
        assert "nvidia.com/gpu" not in str(container.get("resources"))
    assert job["spec"]["nprocPerNode"] == "1"
    # kind has one node and no ReadWriteMany storage: the checkpoint claim is ReadWriteOnce
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["ddp"] == {"backend": "gloo", "device": "cpu"}


def test_kustomization_lists_existing_files():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource


def _granted(verb: str) -> set[tuple[str, str]]:
    return {
        (group, resource)
        for rule in RULES
        if verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_rbac_lets_submit_create_and_delete_everything_render_makes(kind):
    """Every object of a render with each optional object on: the Role can create and delete it."""
    docs = render_job(
        kind, "--name", "demo", "--create-service-account", "--podmonitor", "--dashboard"
    )
    made = {(resource_for(doc).group, resource_for(doc).plural) for doc in docs}
    assert {"ServiceAccount", "PodMonitor", "PersistentVolumeClaim"} <= {d["kind"] for d in docs}
    for verb in ("create", "delete"):
        assert made <= _granted(verb), (verb, made - _granted(verb))


def test_rbac_lets_status_logs_and_delete_read_what_they_read():
    assert {("", "pods"), ("", "serviceaccounts")} <= _granted("list")
    assert ("", "pods/log") in _granted("get")
    assert ("", "pods/proxy") in _granted("get")  # status: each pod's /metrics
    assert ("", "pods") not in _granted("delete")  # the operators own the pods
