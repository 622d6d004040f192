"""`kubeddp validate`: each operator webhook rule and each schema check catches its mistake,
reported as one line with the document kind/name and the field path."""

from __future__ import annotations

import copy
import functools
import io
import sys

import pytest
import yaml

from kubeddp.tools.cli.main import main
from tests.helpers import render
from tests.helpers.manifest_paths import PYTORCHJOB_REPLICAS, TRAINJOB_POD


@functools.cache
def _rendered(kind: str, *options: str) -> dict:
    return render.job_of(kind, "--name", "demo", *options)


def job_of(kind: str, *options: str) -> dict:
    """The job rendered with `options` (once per process: each case changes its own copy)."""
    return copy.deepcopy(_rendered(kind, *options))


def pytorchjob(*options: str) -> dict:
    return job_of("pytorchjob", *options)


def with_master(*options: str) -> dict:
    return job_of("pytorchjob", "--master-replica", *options)


def first_container(job: dict, replica: str = "Worker") -> dict:
    return job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


def mutate(job: dict, change) -> dict:
    job = copy.deepcopy(job)
    change(job)
    return job


def _set(path: list, value):
    def change(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _delete(path: list):
    def change(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return change


REPLICAS = PYTORCHJOB_REPLICAS
# case -> (the job, rendered when the case runs: every pytest-xdist process collects every
# module; the change that breaks it; the field path the one line must name)
BAD = {
    "master-replicas-2": (
        lambda: with_master("--nodes", "2"),
        _set([*REPLICAS, "Master", "replicas"], 2),
        "spec.pytorchReplicaSpecs.Master.replicas",
    ),
    "master-replicas-implicit": (
        lambda: with_master("--nodes", "2"),
        _delete([*REPLICAS, "Master", "replicas"]),
        "spec.pytorchReplicaSpecs.Master.replicas",
    ),
    "no-replicas": (
        lambda: pytorchjob("--nodes", "2"),
        _set(REPLICAS, {}),
        "spec.pytorchReplicaSpecs",
    ),
    "master-container-name": (
        lambda: with_master("--nodes", "2"),
        lambda d: first_container(d, "Master").update(name="main"),
        "spec.pytorchReplicaSpecs.Master.template.spec.containers",
    ),
    "replica-key": (
        lambda: pytorchjob("--nodes", "2"),
        lambda d: d["spec"]["pytorchReplicaSpecs"].update(
            Chief=d["spec"]["pytorchReplicaSpecs"]["Worker"]
        ),
        "spec.pytorchReplicaSpecs.Chief",
    ),
    "container-name": (
        lambda: pytorchjob(),
        lambda d: first_container(d).update(name="main"),
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers",
    ),
    "job-name": (lambda: pytorchjob(), _set(["metadata", "name"], "Demo_Job"), "metadata.name"),
    "restart-policy": (
        lambda: pytorchjob(),
        _set([*REPLICAS, "Worker", "restartPolicy"], "Sometimes"),
        "spec.pytorchReplicaSpecs.Worker.restartPolicy",
    ),
    "clean-pod-policy": (
        lambda: pytorchjob(),
        _set(["spec", "runPolicy", "cleanPodPolicy"], "Some"),
        "spec.runPolicy.cleanPodPolicy",
    ),
    "nproc": (lambda: pytorchjob(), _set(["spec", "nprocPerNode"], "many"), "spec.nprocPerNode"),
    "rdzv-backend": (
        lambda: pytorchjob("--elastic", "2:4"),
        _set(["spec", "elasticPolicy", "rdzvBackend"], "zookeeper"),
        "spec.elasticPolicy.rdzvBackend",
    ),
    "elastic-master": (
        lambda: pytorchjob("--elastic", "2:4"),
        lambda d: d["spec"]["pytorchReplicaSpecs"].update(
            Master=dict(d["spec"]["pytorchReplicaSpecs"]["Worker"], replicas=1)
        ),
        "spec.pytorchReplicaSpecs.Master",
    ),
    "elastic-min-max": (
        lambda: pytorchjob("--elastic", "2:4"),
        _set(["spec", "elasticPolicy", "minReplicas"], 5),
        "spec.elasticPolicy",
    ),
    "pytorchjob-unknown-field": (
        lambda: pytorchjob(),
        _set(["spec", "runPolicy", "cleanup"], "All"),
        "spec.runPolicy.cleanup",
    ),
    "pytorchjob-wrong-type": (
        lambda: pytorchjob("--nodes", "3"),
        _set([*REPLICAS, "Worker", "replicas"], "2"),
        "spec.pytorchReplicaSpecs.Worker.replicas",
    ),
    "pod-unknown-field": (
        lambda: pytorchjob(),
        lambda d: first_container(d).update(gpu=1),
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].gpu",
    ),
    "trainjob-reserved-env": (
        lambda: job_of("trainjob", "--env", "NNODES=3"),  # render refuses PET_*: written by hand
        lambda d: d["spec"]["trainer"]["env"][0].update(name="PET_NNODES"),
        "spec.trainer.env[0].name",
    ),
    "trainjob-container-name": (
        lambda: job_of("trainjob"),
        _set([*TRAINJOB_POD, "containers", 0, "name"], "trainer"),
        "containers[0].name",
    ),
    "trainjob-unknown-field": (
        lambda: job_of("trainjob"),
        _set([*TRAINJOB_POD, "priorityClassName"], "x"),
        "template.spec.priorityClassName",
    ),
    "trainjob-wrong-type": (
        lambda: job_of("trainjob"),
        _set(["spec", "trainer", "numNodes"], "2"),
        "spec.trainer.numNodes",
    ),
    "trainjob-name": (
        lambda: job_of("trainjob"),
        _set(["metadata", "name"], "-x"),
        "metadata.name",
    ),
    "indexedjob-parallelism": (
        lambda: job_of("indexedjob", "--nodes", "3"),
        _set(["spec", "parallelism"], 2),
        "spec.parallelism",
    ),
    "indexedjob-subdomain": (
        lambda: job_of("indexedjob"),
        _set(["spec", "template", "spec", "subdomain"], "other"),
        "spec.template.spec.subdomain",
    ),
    "job-unknown-field": (lambda: job_of("indexedjob"), _set(["spec", "completion"], 2), "spec"),
    "configmap-wrong-type": (
        lambda: render.render_job("pytorchjob")[0],
        _set(["data", "n"], 1),
        "data.n",
    ),
}


def run_validate(docs: list[dict], monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump_all(docs)))
    code = main(["validate", "-", "--validate-against", "offline"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", list(BAD))
def test_each_rule_is_caught(case, monkeypatch, capsys):
    job, change, path = BAD[case]
    bad = mutate(job(), change)
    code, out, _ = run_validate([bad], monkeypatch, capsys)
    assert code == 1
    lines = out.strip().splitlines()
    name = bad["metadata"]["name"]
    assert any(f"{bad['kind']}/{name}: " in line and path in line for line in lines), out


def test_good_manifests_pass_and_report_ok(monkeypatch, capsys):
    docs = [
        *render.render_job("pytorchjob", "--nodes", "3", "--podmonitor"),
        *render.render_job("trainjob", "--name", "tj"),
        *render.render_job("indexedjob", "--name", "ij", "--checkpoint-size", "1Gi"),
    ]
    code, out, err = run_validate(docs, monkeypatch, capsys)
    assert (code, out) == (0, "")
    assert "ok:" in err


def test_a_master_is_valid_with_a_one_line_warning(monkeypatch, capsys):
    """The operator accepts a Master; its init-pytorch container is what fails later."""
    code, out, err = run_validate([with_master("--nodes", "2")], monkeypatch, capsys)
    assert (code, out) == (0, "")
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert warning.startswith("kubeddp validate: warning: <stdin>: PyTorchJob/demo: ")
    assert "init-pytorch" in warning and "--pytorch-init-container-template-file" in warning
    _, _, err = run_validate([pytorchjob("--nodes", "2")], monkeypatch, capsys)
    assert "warning" not in err  # Workers only: nothing to warn about


def test_validate_reads_files_and_names_them(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(mutate(pytorchjob(), _set(["metadata", "name"], "X"))))
    assert main(["validate", str(path), "--validate-against", "offline"]) == 1
    assert capsys.readouterr().out.startswith(f"{path}: PyTorchJob/X: metadata.name")


@pytest.mark.parametrize(
    "files", [["FILE"], ["-f", "FILE"], ["--filename", "FILE"], ["FILE", "-f", "FILE"]], ids=str
)
def test_validate_takes_files_as_submit_does(files, tmp_path, capsys):
    """`validate -f FILE` as `submit -f FILE` (and kubectl); positional files too."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(mutate(pytorchjob(), _set(["metadata", "name"], "X"))))
    argv = [str(path) if word == "FILE" else word for word in files]
    assert main(["validate", *argv, "--validate-against", "offline"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == files.count("FILE") and out[0].startswith(f"{path}: PyTorchJob/X: ")


def test_validate_without_a_file_says_how_to_name_one(capsys):
    assert main(["validate", "--validate-against", "offline"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "kubeddp validate: error: no file given; name the manifests: kubeddp validate "
        "FILE... or -f FILE (- reads stdin)"
    )


def test_not_yaml_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("a: [1,\n")
    assert main(["validate", str(path), "--validate-against", "offline"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "broken.yaml" in err


def test_unknown_kind_is_reported(monkeypatch, capsys):
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    code, out, _ = run_validate([doc], monkeypatch, capsys)
    assert code == 1 and "no schema known for example.com/v1/Widget" in out
