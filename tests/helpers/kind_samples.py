"""A sample of every chart value: values that set it to something other than its default, with
what it needs (tests/unit/test_kind_values.py sets each for every kind), and the `kubeddp render`
option case written from a sample (tests/unit/test_render_options.py)."""

from __future__ import annotations

import json
from typing import Any

from kubeddp.tools.manifests.chart.value_types import Flag
from kubeddp.tools.manifests.chart.values import VALUES
from kubeddp.tools.manifests.kinds import JobKind

AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]
        }
    }
}
VOLUME = {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "d"}}

# chart value path -> values that set it to something other than its default, with what it needs
SAMPLES: dict[str, dict[str, Any]] = {
    "nameOverride": {"nameOverride": "other"},
    "fullnameOverride": {"fullnameOverride": "job-b"},
    "namespaceOverride": {"namespaceOverride": "team"},
    "managedBy": {"managedBy": "kubeddp"},
    "image.repository": {"image": {"repository": "reg/other"}},
    "image.tag": {"image": {"tag": "v9"}},
    "image.digest": {"image": {"digest": "sha256:" + "a" * 64}},
    "image.pullPolicy": {"image": {"pullPolicy": "Always"}},
    "imagePullSecrets": {"imagePullSecrets": [{"name": "pull"}]},
    "nodes": {"nodes": 3},
    "nprocPerNode": {"nprocPerNode": 2},
    "gpusPerNode": {"gpusPerNode": 2},
    "resources": {"resources": {"requests": {"cpu": "3"}}},
    "requestsPerGpu.cpu": {"gpusPerNode": 1, "requestsPerGpu": {"cpu": "3"}},
    "requestsPerGpu.memory": {"gpusPerNode": 1, "requestsPerGpu": {"memory": "5Gi"}},
    "shmSize": {"shmSize": "1Gi"},
    "elastic.enabled": {"elastic": {"enabled": True}, "nodes": 2},
    "elastic.minNodes": {"elastic": {"enabled": True, "minNodes": 2}, "nodes": 2},
    "elastic.maxNodes": {"elastic": {"enabled": True, "maxNodes": 7}, "nodes": 2},
    "elastic.rdzvId": {"elastic": {"enabled": True, "rdzvId": "run-7"}, "nodes": 2},
    "elastic.maxRestarts": {"elastic": {"enabled": True, "maxRestarts": 9}, "nodes": 2},
    "restartPolicy": {"restartPolicy": "Never"},
    "backoffLimit": {"backoffLimit": 0},
    "ttlSecondsAfterFinished": {"ttlSecondsAfterFinished": 60},
    "timeLimit": {"timeLimit": "1h30m"},
    "cleanPodPolicy": {"cleanPodPolicy": "All"},
    "terminationGracePeriodSeconds": {"terminationGracePeriodSeconds": 301},
    "pytorchJob.masterReplica": {"pytorchJob": {"masterReplica": True}, "nodes": 2},
    "trainJob.runtimeName": {"trainJob": {"ownRuntime": False, "runtimeName": "other-runtime"}},
    "trainJob.ownRuntime": {"trainJob": {"ownRuntime": False}},
    "trainJob.runtimeKind": {"trainJob": {"ownRuntime": False, "runtimeKind": "TrainingRuntime"}},
    "env": {"env": {"SAMPLE_VAR": "1"}},
    "extraEnv": {"extraEnv": [{"name": "SAMPLE_VAR", "value": "1"}]},
    "envFrom": {"envFrom": [{"configMapRef": {"name": "sample"}}]},
    "volumes": {"volumes": [VOLUME]},
    "podAnnotations": {"podAnnotations": {"sample": "1"}},
    "podLabels": {"podLabels": {"sample": "1"}},
    "nodeSelector": {"nodeSelector": {"pool": "gpu"}},
    "tolerations": {"tolerations": [{"key": "sample", "operator": "Exists"}]},
    "affinity": {"affinity": AFFINITY},
    "priorityClassName": {"priorityClassName": "high"},
    "istio.optOut": {"istio": {"optOut": False}},
    "kueue.queueName": {"kueue": {"queueName": "q"}},
    "network.fabric": {"network": {"fabric": "efa"}},
    "network.deviceResource": {"network": {"fabric": "efa", "deviceResource": "example.com/efa"}},
    "network.devices": {"network": {"fabric": "roce", "deviceResource": "rdma/ib", "devices": 2}},
    "network.instanceType": {"network": {"fabric": "efa", "instanceType": "p5.48xlarge"}},
    "podSecurityLevel": {
        "network": {"fabric": "infiniband", "deviceResource": "rdma/ib"},
        "podSecurityLevel": "privileged",
    },
    "placement.topologyKey": {"placement": {"topologyKey": "cloud.google.com/gce-topology-block"}},
    "placement.mode": {"placement": {"topologyKey": "rack", "mode": "preferred"}},
    "gang.scheduler": {"gang": {"scheduler": "volcano"}},
    "gang.queue": {"gang": {"scheduler": "volcano", "queue": "q"}},
    "podSecurityContext": {"podSecurityContext": {"runAsUser": 1234}},
    "securityContext": {"securityContext": {"runAsUser": 4321}},
    "serviceAccount.create": {"serviceAccount": {"create": True}},
    "serviceAccount.name": {"serviceAccount": {"name": "sa"}},
    "serviceAccount.annotations": {"serviceAccount": {"create": True, "annotations": {"a": "b"}}},
    "config": {"config": {"workload": {"name": "regression"}}},
    "trainer.script": {"trainer": {"script": "/app/t.py"}},
    "trainer.module": {"trainer": {"module": "my.mod"}},
    "trainer.spawnsWorkers": {"trainer": {"script": "/app/t.py", "spawnsWorkers": True}},
    "trainer.args": {"trainer": {"script": "/app/t.py", "args": ["--x"]}},
    "checkpoints.existingClaim": {"checkpoints": {"existingClaim": "mine"}},
    "checkpoints.size": {"checkpoints": {"size": "3Gi"}},
    "checkpoints.storageClassName": {"checkpoints": {"storageClassName": "fast"}},
    "checkpoints.accessMode": {"checkpoints": {"accessMode": "ReadWriteMany"}},
    "checkpoints.storage": {"checkpoints": {"storage": "mount"}, "nodes": 2},
    "checkpoints.lostOnRetry": {"checkpoints": {"lostOnRetry": True}},
    # the keeper's settings, on a job of two pods (one keeper holds the claim)
    "keeper.existingSecret": {"nodes": 2, "keeper": {"existingSecret": "mine"}},
    "keeper.networkPolicy": {"nodes": 2, "keeper": {"networkPolicy": False}},
    "keeper.nodeSelector": {"nodes": 2, "keeper": {"nodeSelector": {"pool": "cpu"}}},
    "keeper.tolerations": {
        "nodes": 2,
        "keeper": {"tolerations": [{"key": "keeper", "operator": "Exists"}]},
    },
    "keeper.affinity": {"nodes": 2, "keeper": {"affinity": AFFINITY}},
    "keeper.priorityClassName": {"nodes": 2, "keeper": {"priorityClassName": "low"}},
    "keeper.resources": {"nodes": 2, "keeper": {"resources": {"limits": {"memory": "1Gi"}}}},
    "monitoring.podMonitor.enabled": {"monitoring": {"podMonitor": {"enabled": True}}},
    "monitoring.podMonitor.labels": {
        "monitoring": {"podMonitor": {"enabled": True, "labels": {"a": "b"}}}
    },
    "monitoring.podMonitor.interval": {
        "monitoring": {"podMonitor": {"enabled": True, "interval": "1m"}}
    },
    "monitoring.dashboard.enabled": {"monitoring": {"dashboard": {"enabled": True}}},
    "monitoring.prometheusRule.enabled": {"monitoring": {"prometheusRule": {"enabled": True}}},
    "monitoring.prometheusRule.labels": {
        "monitoring": {"prometheusRule": {"enabled": True, "labels": {"a": "b"}}}
    },
    "monitoring.prometheusRule.noProgressSeconds": {
        "monitoring": {"prometheusRule": {"enabled": True, "noProgressSeconds": 77}}
    },
    "monitoring.dashboard.labels": {
        "monitoring": {"dashboard": {"enabled": True, "labels": {"a": "b"}}}
    },
}

SETTABLE = [value.path for value in VALUES if value.path != "kind"]


def untabled(kind: JobKind) -> list[str]:
    """Chart values the kind's table forgets, and entries for values the chart lacks."""
    return sorted(set(SETTABLE) ^ set(kind.takes))


def _nested(path: str, item: Any) -> dict[str, Any]:
    for key in reversed(path.split(".")):
        item = {key: item}
    return item


def _sample_of(path: str, samples: dict[str, dict[str, Any]]) -> Any:
    node: Any = samples[path]
    for key in path.split("."):
        node = node[key]
    return node


def derived_case(
    flag: Flag, path: str, samples: dict[str, dict[str, Any]] = SAMPLES
) -> tuple[list[str], dict] | None:
    """The case of an option that sets one value as given (no `sets`, no `convert`): its
    arguments written from the value's sample in SAMPLES."""
    if flag.sets or flag.convert or path not in samples:
        return None
    sample, option = _sample_of(path, samples), flag.name
    if flag.read in ("text", "int"):
        return [option, str(sample)], _nested(path, str(sample) if flag.read == "text" else sample)
    if flag.read == "switch":
        return [option if sample else "--no-" + option[2:]], _nested(path, sample)
    if flag.read == "pairs":
        pairs = [[option, f"{key}={item}"] for key, item in sample.items()]
        return [arg for pair in pairs for arg in pair], _nested(path, sample)
    if flag.read in ("yaml-list", "yaml-map"):
        return [option, json.dumps(sample)], _nested(path, sample)
    return None
