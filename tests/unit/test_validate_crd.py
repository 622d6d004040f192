"""The offline checks (Kubeflow SDK models) agree with the real CRD `openAPIV3Schema` from
../shared/reference/crds: every manifest kubeddp renders passes both; bad ones fail both.

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

from kubeddp.tools.jobspec import JobSpec, check_spec
from kubeddp.tools.manifests import build_manifests
from kubeddp.tools.validate import validate_documents
from tests.helpers.manifest_paths import PYTORCHJOB_MASTER_POD, TRAINJOB_POD

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / ".." / "shared" / "reference" / "crds"
CRD_FILES = {
    "PyTorchJob": ("kubeflow.org_pytorchjobs.v1.9.4.yaml", "v1"),
    "TrainJob": ("trainer.kubeflow.org_trainjobs.v2.3.0.yaml", "v1alpha1"),
}

pytestmark = pytest.mark.skipif(not CRDS.is_dir(), reason=f"reference CRDs not at {CRDS}")


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
        (CRDS / file_name).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
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
    {},
    {
        "nodes": 4,
        "gpus_per_node": 8,
        "cpu": "16",
        "memory": "64Gi",
        "cpu_limit": "32",
        "memory_limit": "128Gi",
        "shm_size": "16Gi",
    },
    {
        "nodes": 2,
        "checkpoint_size": "10Gi",
        "podmonitor": True,
        "queue": "q",
        "env": {"NCCL_DEBUG": "INFO"},
        "service_account": "sa",
        "istio_opt_out": False,
    },
    {
        "nodes": 2,
        "checkpoint_claim": "ckpt",
        "node_selector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                ]
            }
        },
    },
    {"nodes": 3, "overrides": ["train.max_steps=3"], "nproc_per_node": "2"},
]
PYTORCHJOB_ONLY = [
    {"elastic": (2, 4), "max_restarts": 5},
    {"elastic": (1, 3), "nodes": 2, "gpus_per_node": 4},
    {"gang": "volcano", "priority_class": "high", "nodes": 3},
    {
        "restart_policy": "OnFailure",
        "backoff_limit": 0,
        "ttl_seconds_after_finished": 60,
        "clean_pod_policy": "All",
    },
]


def rendered_jobs() -> list[dict]:
    jobs = []
    for kind, options in itertools.chain(
        itertools.product(["pytorchjob", "trainjob"], OPTION_SETS),
        itertools.product(["pytorchjob"], PYTORCHJOB_ONLY),
    ):
        spec = JobSpec(kind=kind, name="job", **options)
        check_spec(spec)
        jobs.append(build_manifests(spec)[-2 if spec.podmonitor else -1])
    return jobs


JOBS = rendered_jobs()


@pytest.mark.parametrize("index", range(len(JOBS)))
def test_every_rendered_job_passes_offline_and_crd(index, validators):
    job = JOBS[index]
    assert job["kind"] in CRD_FILES
    assert crd_errors(validators, job) == []
    assert validate_documents([job]) == []
    schemas = {f"{job['apiVersion']}/{job['kind']}": crd_schema(job["kind"])}
    assert validate_documents([job], crd_schemas=schemas) == []


def at(doc: dict, path: list):
    for key in path:
        doc = doc[key]
    return doc


PT_POD = PYTORCHJOB_MASTER_POD
TJ_POD = TRAINJOB_POD
# (kind, where, key, value): set doc[where][key] = value; every one is invalid per the CRD.
BAD_EDITS = [
    ("pytorchjob", ["spec"], "nprocsPerNode", "2"),  # typo'd field
    ("pytorchjob", ["spec", "runPolicy"], "backoff", 3),
    ("pytorchjob", ["spec", "pytorchReplicaSpecs", "Master"], "replica", 1),
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
    spec = JobSpec(kind=kind, name="job", nodes=3)
    job = copy.deepcopy(build_manifests(spec)[-1])
    at(job, where)[key] = value
    assert crd_errors(validators, job), "the CRD accepts it: not a bad case"
    problems = validate_documents([job])
    assert problems, "offline validation missed what the CRD rejects"
    assert any(key in p.path or key in p.message for p in problems), problems
    schemas = {f"{job['apiVersion']}/{job['kind']}": crd_schema(job["kind"])}
    assert validate_documents([job], crd_schemas=schemas)
