"""The offline checks (Kubeflow SDK models) agree with the real CRD `openAPIV3Schema` from
tests/reference/crds: every manifest kubeddp renders passes both; bad ones fail both.

The CRD side is written here, independent of kubeddp: jsonschema against the schema with
unknown fields forbidden (what `kubectl apply --validate=strict` / field validation does).
"""

from __future__ import annotations

import copy
import functools
import itertools
from pathlib import Path

import jsonschema
import pytest
import yaml

from kubeddp.tools.manifests.validate import validate_documents
from tests.helpers import reference
from tests.helpers.manifest_paths import PYTORCHJOB_WORKER_POD, TRAINJOB_POD
from tests.helpers.render import job_of

REPO = Path(__file__).resolve().parents[2]
CRDS = reference.CRDS
CRD_FILES = {
    "PyTorchJob": ("kubeflow.org_pytorchjobs.v1.9.4.yaml", "v1"),
    "TrainJob": ("trainer.kubeflow.org_trainjobs.v2.3.0.yaml", "v1alpha1"),
}


def forbid_unknown_fields(node):
    if isinstance(node, dict):
        node = {key: forbid_unknown_fields(value) for key, value in node.items()}
        if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        return node
    if isinstance(node, list):
        return [forbid_unknown_fields(item) for item in node]
    return node


@functools.cache
def crd_schema(kind: str) -> dict:
    file_name, version = CRD_FILES[kind]
    crd = yaml.load(
        reference.read_text(CRDS / file_name), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    )
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def validators() -> dict[str, jsonschema.Draft7Validator]:
    return {
        kind: jsonschema.Draft7Validator(forbid_unknown_fields(crd_schema(kind)))
        for kind in CRD_FILES
    }


def crd_errors(validators, doc: dict) -> list[str]:
    return [
        f"{list(e.absolute_path)}: {e.message}" for e in validators[doc["kind"]].iter_errors(doc)
    ]


OPTION_SETS = [
    [],
    [
        "--nodes", "4", "--gpus-per-node", "8", "--cpu", "16", "--memory", "64Gi",
        "--cpu-limit", "32", "--memory-limit", "128Gi", "--shm-size", "16Gi",
    ],
    [
        "--nodes", "2", "--checkpoint-size", "10Gi", "--podmonitor", "--queue", "q",
        "--env", "NCCL_DEBUG=INFO", "--service-account", "sa", "--no-istio-opt-out",
    ],
    [
        "--nodes", "2", "--checkpoint-pvc", "ckpt", "--node-selector", "pool=gpu",
        "--tolerations", "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]",
        "--affinity",
        "{podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution:"
        " [{weight: 1, podAffinityTerm: {topologyKey: kubernetes.io/hostname}}]}}",
    ],
    ["--nodes", "3", "--set", "train.max_steps=3", "--nproc-per-node", "2", "--time-limit", "12h"],
    [  # what only the chart had before render rendered the chart
        "--image-pull-secret", "regcred", "--pod-label", "team=ml", "--pod-annotation", "a=b",
        "--extra-env", "[{name: TOKEN, valueFrom: {secretKeyRef: {name: s, key: k}}}]",
        "--image", "registry.local:5000/kubeddp@sha256:" + "0" * 64,
    ],
]  # fmt: skip
PYTORCHJOB_ONLY = [
    ["--master-replica", "--nodes", "3", "--checkpoints-lost-on-retry"],
    ["--elastic", "2:4", "--max-restarts", "5", "--rdzv-id", "run-1"],
    ["--elastic", "1:3", "--nodes", "2", "--gpus-per-node", "4"],
    ["--gang", "volcano", "--gang-queue", "research", "--priority-class", "high", "--nodes", "3"],
    [
        "--restart-policy", "OnFailure", "--backoff-limit", "0",
        "--ttl-seconds-after-finished", "60", "--clean-pod-policy", "All",
    ],
]  # fmt: skip


# What is rendered, by index (rendered when its test runs, not when the tests are collected:
# every pytest-xdist process collects every module)
JOBS = list(
    itertools.chain(
        itertools.product(["pytorchjob", "trainjob"], OPTION_SETS),
        itertools.product(["pytorchjob"], PYTORCHJOB_ONLY),
    )
)


@functools.cache
def rendered(kind: str, *options: str) -> dict:
    return job_of(kind, *options)


@pytest.mark.parametrize("index", range(len(JOBS)))
def test_every_rendered_job_passes_offline_and_crd(index, validators):
    kind, options = JOBS[index]
    job = rendered(kind, "--name", "job", *options)
    assert job["kind"] in CRD_FILES
    assert crd_errors(validators, job) == []
    assert validate_documents([job]) == []
    schemas = {f"{job['apiVersion']}/{job['kind']}": crd_schema(job["kind"])}
    assert validate_documents([job], crd_schemas=schemas) == []


def at(doc: dict, path: list):
    for key in path:
        doc = doc[key]
    return doc


PT_POD = PYTORCHJOB_WORKER_POD
TJ_POD = TRAINJOB_POD
# (kind, where, key, value): set doc[where][key] = value; every one is invalid per the CRD.
BAD_EDITS = [
    ("pytorchjob", ["spec"], "nprocsPerNode", "2"),  # typo'd field
    ("pytorchjob", ["spec", "runPolicy"], "backoff", 3),
    ("pytorchjob", ["spec", "pytorchReplicaSpecs", "Worker"], "replica", 1),
    ("pytorchjob", ["spec", "pytorchReplicaSpecs", "Worker"], "replicas", "3"),  # wrong type
    ("pytorchjob", ["spec", "runPolicy"], "backoffLimit", "3"),
    ("pytorchjob", ["spec"], "runPolicy", "Always"),
    ("pytorchjob", [*PT_POD], "restartPolicyy", "Never"),
    ("pytorchjob", [*PT_POD, "containers", 0], "imagePullPolicyy", "Always"),
    ("pytorchjob", [*PT_POD, "containers", 0], "args", "--config"),
    ("pytorchjob", [*PT_POD, "containers", 0, "ports", 0], "containerPort", "23456"),
    ("pytorchjob", [*PT_POD, "volumes", 2, "emptyDir"], "sizeLimit", [1]),
    ("pytorchjob", [*PT_POD], "terminationGracePeriodSeconds", "120"),
    ("trainjob", ["spec"], "podTemplateOverrides", []),  # the v2.1 field name
    ("trainjob", ["spec", "trainer"], "numProcPerNode", "auto"),  # int32 since v2.2
    ("trainjob", ["spec", "trainer"], "numNodes", "2"),
    ("trainjob", ["spec", "trainer"], "resources", {}),
    ("trainjob", ["spec", "runtimeRef"], "namespace", "x"),
    ("trainjob", [*TJ_POD], "priorityClassName", "high"),  # not patchable in v2.3
    ("trainjob", [*TJ_POD, "containers", 0], "image", "other"),  # not patchable in v2.3
    ("trainjob", [*TJ_POD], "terminationGracePeriodSeconds", "120"),
]


@pytest.mark.parametrize(
    ("kind", "where", "key", "value"),
    BAD_EDITS,
    ids=[f"{k}-{'.'.join(map(str, w[-2:]))}.{f}" for k, w, f, _ in BAD_EDITS],
)
def test_bad_manifests_fail_offline_and_crd(kind, where, key, value, validators):
    job = copy.deepcopy(rendered(kind, "--name", "job", "--nodes", "3"))
    at(job, where)[key] = value
    assert crd_errors(validators, job), "the CRD accepts it: not a bad case"
    problems = validate_documents([job])
    assert problems, "offline validation missed what the CRD rejects"
    assert any(key in p.path or key in p.message for p in problems), problems
    schemas = {f"{job['apiVersion']}/{job['kind']}": crd_schema(job["kind"])}
    assert validate_documents([job], crd_schemas=schemas)
