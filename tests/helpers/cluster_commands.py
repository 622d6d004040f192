"""The cluster commands in process against the fake API server (tests/helpers/fake_api.py):
the REST paths kubeddp calls in its namespace, the objects a running PyTorchJob answers with,
and `run`, the CLI's exit code and output as a user sees them."""

from __future__ import annotations

from kubeddp.tools.cli.main import main
from tests.helpers import fake_api, reference

CRDS = reference.CRDS
NS = fake_api.NAMESPACE
PYTORCHJOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
TRAINJOBS = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs"
RUNTIMES = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainingruntimes"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
CLAIMS = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"  # checkpoints: a claim by default
PODS = f"/api/v1/namespaces/{NS}/pods"
SERVICES = f"/api/v1/namespaces/{NS}/services"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"  # the checkpoint keeper (2+ pods)
SECRETS = f"/api/v1/namespaces/{NS}/secrets"  # the keeper's secret
NETWORK_POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
# What `kubeddp submit` of a job with a keeper (2+ pods) posts after the job, in order
KEEPER_JOB_COMPANIONS = (CONFIGMAPS, SECRETS, CLAIMS, SERVICES, NETWORK_POLICIES, DEPLOYMENTS)
STORAGE_CLASSES = "/apis/storage.k8s.io/v1/storageclasses"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


PYTORCHJOB_KEY = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "demo"},
}
PYTORCHJOB_STATUS = {
    **PYTORCHJOB_KEY,
    "status": {
        "conditions": [
            {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": "ok"},
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"},
        ],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1, "failed": 0}},
    },
}
PODS_LIST = {
    "kind": "PodList",
    "apiVersion": "v1",
    "items": [
        {
            "metadata": {"name": "demo-master-0"},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "containerStatuses": [{"restartCount": 0}]},
        },
        {
            "metadata": {"name": "demo-worker-0"},
            "spec": {"nodeName": "n2"},
            "status": {"phase": "Running", "containerStatuses": [{"restartCount": 2}]},
        },
    ],
}
