"""The chart values that land the same way for every kind, and the ones only a PyTorchJob takes.

A kind's `takes` table (tools/manifests/kinds/<kind>.py) starts from `common(...)`, naming the
objects its pods and its job spec are rendered into, and adds or overrides the values it treats its
own way. tests/unit/test_kind_values.py sets every chart value for every kind and checks the table.
"""

from __future__ import annotations

from kubeddp.tools.manifests.kinds import Ignored, Lands, Refused

CONFIG_MAP = "ConfigMap"
CLAIM = "PersistentVolumeClaim"
DEPLOYMENT = "Deployment"
SECRET = "Secret"
NETWORK_POLICY = "NetworkPolicy"
# the checkpoint keeper pod, its Service, the job's keeper secret and who may reach the keeper
KEEPER = (DEPLOYMENT, "Service", SECRET, NETWORK_POLICY)
SERVICE_ACCOUNT = "ServiceAccount"
POD_MONITOR = "PodMonitor"
PROMETHEUS_RULE = "PrometheusRule"  # the chart's alerts (docs/diagnostics.md)

# Fields of the training pod (templates/_pod.tpl), each with the pod field that carries it:
# `metadata.X`, `spec.X` or `container.X` (the training container). Every kind renders them into
# the object that holds its pods; a TrainJob takes those its CRD lets it set and refuses the
# rest (kinds/trainjob_fields.py). tests/unit/test_kind_values.py checks each carrying field.
POD_FIELDS: dict[str, str] = {
    "image.repository": "container.image",
    "image.digest": "container.image",
    "image.pullPolicy": "container.imagePullPolicy",
    "imagePullSecrets": "spec.imagePullSecrets",
    "gpusPerNode": "container.resources",
    "resources": "container.resources",
    "requestsPerGpu.cpu": "container.resources",
    "requestsPerGpu.memory": "container.resources",
    "shmSize": "spec.volumes",
    "memorySnapshots.size": "container.resources",
    "terminationGracePeriodSeconds": "spec.terminationGracePeriodSeconds",
    "env": "container.env",
    "extraEnv": "container.env",
    "envFrom": "container.envFrom",
    "volumes": "spec.volumes",
    "podAnnotations": "metadata.annotations",
    "podLabels": "metadata.labels",
    "nodeSelector": "spec.nodeSelector",
    "tolerations": "spec.tolerations",
    "affinity": "spec.affinity",
    "priorityClassName": "spec.priorityClassName",
    "network.fabric": "container.env",
    "network.deviceResource": "container.resources",
    "network.devices": "container.resources",
    "network.instanceType": "container.resources",
    "placement.topologyKey": "spec.affinity",
    "placement.mode": "spec.affinity",
    "istio.optOut": "metadata.annotations",
    "podSecurityContext": "spec.securityContext",
    "securityContext": "container.securityContext",
    "serviceAccount.name": "spec.serviceAccountName",
    "trainer.script": "container.args",
    "trainer.module": "container.args",
    "trainer.spawnsWorkers": "container.args",
    "trainer.args": "container.args",
}
# The keeper pod's own settings (null: the training pods'); templates/keeper.yaml
KEEPER_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "resources")
# Values that name or label every object the chart renders.
EVERY_OBJECT = ("nameOverride", "fullnameOverride", "namespaceOverride", "managedBy", "image.tag")

ONLY_FOR_PYTORCHJOB_WHY = {
    "elastic.enabled": "its node count is fixed; use kind PyTorchJob for an elastic job",
    "gang.scheduler": "use `kueue.queueName` to admit the job as a whole",
    "cleanPodPolicy": "it is a PyTorchJob field; leave it null",
    "pytorchJob.masterReplica": "it is a PyTorchJob replica; leave it false",
}
ELASTIC_PARTS = ("elastic.minNodes", "elastic.maxNodes", "elastic.rdzvId", "elastic.maxRestarts")
# Chart values only a PyTorchJob takes; the other kinds refuse them.
ONLY_FOR_PYTORCHJOB: dict[str, Refused] = {
    **{path: Refused(why) for path, why in ONLY_FOR_PYTORCHJOB_WHY.items()},
    **{
        path: Refused(ONLY_FOR_PYTORCHJOB_WHY["elastic.enabled"], by="elastic.enabled")
        for path in ELASTIC_PARTS
    },
    "gang.queue": Refused(ONLY_FOR_PYTORCHJOB_WHY["gang.scheduler"], by="gang.scheduler"),
}
TRAINJOB_RUNTIME = ("trainJob.runtimeName", "trainJob.ownRuntime", "trainJob.runtimeKind")
# The TrainJob section, which the other kinds' templates never read.
ONLY_FOR_TRAINJOB = {
    path: Ignored("a TrainJob setting: the runtime a TrainJob runs on") for path in TRAINJOB_RUNTIME
}


def common(job: str, pods: str, every: tuple[str, ...]) -> dict[str, Lands]:
    """The values every kind takes alike: `job` holds the job spec, `pods` the pod template,
    `every` is every object a default render gives."""
    objects = Lands((*every,))
    return {
        **{path: objects for path in EVERY_OBJECT},
        **{path: Lands((pods,)) for path in POD_FIELDS},
        "nodes": Lands((job, *KEEPER)),  # more than one node: a keeper holds the claim
        "kueue.queueName": Lands((job,)),
        "podSecurityLevel": Lands((job,)),  # the job's network line names it
        "serviceAccount.create": Lands((SERVICE_ACCOUNT, pods)),
        "serviceAccount.annotations": Lands((SERVICE_ACCOUNT,)),
        "config": Lands((CONFIG_MAP,)),
        "checkpoints.existingClaim": Lands((CLAIM, pods)),
        "checkpoints.size": Lands((CLAIM,)),
        "checkpoints.storageClassName": Lands((CLAIM,)),
        "checkpoints.accessMode": Lands((CLAIM,)),
        "checkpoints.storage": Lands((CLAIM, pods, *KEEPER)),
        "checkpoints.lostOnRetry": Lands((CLAIM, pods)),
        "keeper.existingSecret": Lands((SECRET, pods, DEPLOYMENT)),
        "keeper.networkPolicy": Lands((NETWORK_POLICY,)),
        **{f"keeper.{field}": Lands((DEPLOYMENT,)) for field in KEEPER_POD_FIELDS},
        "monitoring.podMonitor.enabled": Lands((POD_MONITOR,)),
        "monitoring.podMonitor.labels": Lands((POD_MONITOR,)),
        "monitoring.podMonitor.interval": Lands((POD_MONITOR,)),
        "monitoring.dashboard.enabled": Lands((CONFIG_MAP,)),
        "monitoring.dashboard.labels": Lands((CONFIG_MAP,)),
        "monitoring.prometheusRule.enabled": Lands((PROMETHEUS_RULE,)),
        "monitoring.prometheusRule.labels": Lands((PROMETHEUS_RULE,)),
        "monitoring.prometheusRule.noProgressSeconds": Lands((PROMETHEUS_RULE,)),
    }
