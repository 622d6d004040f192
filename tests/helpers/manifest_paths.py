"""Where the pod spec sits inside the Kubeflow kinds kubeddp renders (for tests that edit it)."""

PYTORCHJOB_REPLICAS = ["spec", "pytorchReplicaSpecs"]
PYTORCHJOB_MASTER_POD = [*PYTORCHJOB_REPLICAS, "Master", "template", "spec"]  # --master-replica
PYTORCHJOB_WORKER_POD = [*PYTORCHJOB_REPLICAS, "Worker", "template", "spec"]
TRAINJOB_POD = [
    "spec",
    "runtimePatches",
    0,
    "trainingRuntimeSpec",
    "template",
    "spec",
    "replicatedJobs",
    0,
    "template",
    "spec",
    "template",
    "spec",
]
