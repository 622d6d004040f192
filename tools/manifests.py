"""Build the Kubernetes objects of one job from a `JobSpec`: pure, deterministic, no I/O.

`build_manifests(spec)` returns, in apply order: ConfigMap (trainer config), PVC (when a size is
given), headless Service (Indexed Job), the job (PyTorchJob | TrainJob | batch/v1 Job) and a
PodMonitor (when asked). The Helm chart's tests compare their output with these objects.
"""

from __future__ import annotations

import copy
import json
import posixpath
from typing import Any

import yaml

from kubeddp.tools.jobspec import (
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_CLEAN_POD_POLICY,
    DEFAULT_RESTART_POLICY,
    GANG_SCHEDULERS,
    TRAINJOB_RUNTIME,
    JobSpec,
    resolved_nodes,
    resolved_nproc,
)
from kubeddp.trainer import constants as C

PYTORCHJOB_API = "kubeflow.org/v1"
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
PODMONITOR_API = "monitoring.coreos.com/v1"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
RUNTIME_PATCH_MANAGER = "kubeddp.io/render"
TRAINJOB_REPLICATED_JOB = "node"  # the replicatedJob of the torch-distributed runtime
GPU_RESOURCE = "nvidia.com/gpu"
INDEXEDJOB_PORT_NAME = "rendezvous"
CONFIG_KEY = posixpath.basename(C.CONFIG_FILE)
# Exit codes below 128 are the program's own failures: retrying cannot help. Codes >= 128 are
# signals (143 = preempted after a checkpoint) and are retried, like PyTorchJob's ExitCode policy.
NON_RETRYABLE_EXIT_CODES = list(range(1, 128))

JOB_NAME_LABEL = {
    "pytorchjob": C.PYTORCHJOB_JOB_NAME_LABEL,
    "trainjob": C.TRAINJOB_NAME_LABEL,
    "indexedjob": C.INDEXEDJOB_NAME_LABEL,
}
POD_TARGET_LABELS = {
    "pytorchjob": [
        C.PYTORCHJOB_JOB_NAME_LABEL,
        C.PYTORCHJOB_REPLICA_TYPE_LABEL,
        C.PYTORCHJOB_REPLICA_INDEX_LABEL,
    ],
    "trainjob": [C.TRAINJOB_NAME_LABEL, C.INDEXEDJOB_INDEX_LABEL],
    "indexedjob": [C.INDEXEDJOB_NAME_LABEL, C.INDEXEDJOB_INDEX_LABEL],
}


def config_map_name(spec: JobSpec) -> str:
    return f"{spec.name}-config"


def pvc_name(spec: JobSpec) -> str:
    return spec.checkpoint_claim or f"{spec.name}-checkpoints"


def labels(spec: JobSpec, component: str) -> dict[str, str]:
    return {
        C.LABEL_NAME: C.APP_NAME,
        C.LABEL_INSTANCE: spec.name,
        C.LABEL_MANAGED_BY: C.APP_NAME,
        C.LABEL_COMPONENT: component,
    }


def metadata(spec: JobSpec, name: str, component: str, extra: dict | None = None) -> dict:
    meta: dict[str, Any] = {"name": name}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    meta["labels"] = {**labels(spec, component), **(extra or {})}
    return meta


def trainer_config_text(spec: JobSpec) -> str:
    """The config file shipped in the ConfigMap; checkpoints always go to the mounted volume."""
    data = copy.deepcopy(spec.trainer_config)
    data.setdefault("checkpoint", {})
    data["checkpoint"].setdefault("dir", C.CHECKPOINT_DIR)
    return yaml.safe_dump(data, sort_keys=False)


def container_args(spec: JobSpec) -> list[str]:
    args = ["--", "--config", C.CONFIG_FILE]
    for text in spec.overrides:
        args += ["--set", text]
    return args


def resources(spec: JobSpec) -> dict[str, dict[str, str]]:
    requests = {k: v for k, v in (("cpu", spec.cpu), ("memory", spec.memory)) if v}
    limits = {k: v for k, v in (("cpu", spec.cpu_limit), ("memory", spec.memory_limit)) if v}
    if spec.gpus_per_node:
        requests[GPU_RESOURCE] = str(spec.gpus_per_node)
        limits[GPU_RESOURCE] = str(spec.gpus_per_node)
    out = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": key, "value": value} for key, value in env.items()]


def container_security_context() -> dict:
    return {**copy.deepcopy(C.CONTAINER_SECURITY_CONTEXT), "readOnlyRootFilesystem": True}


def volume_mounts() -> list[dict]:
    return [
        {"name": "config", "mountPath": C.CONFIG_DIR, "readOnly": True},
        {"name": "checkpoints", "mountPath": C.CHECKPOINT_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": C.SCRATCH_DIR},
    ]


def volumes(spec: JobSpec) -> list[dict]:
    if spec.checkpoint_claim or spec.checkpoint_size:
        checkpoints = {
            "name": "checkpoints",
            "persistentVolumeClaim": {"claimName": pvc_name(spec)},
        }
    else:
        checkpoints = {"name": "checkpoints", "emptyDir": {}}
    return [
        {"name": "config", "configMap": {"name": config_map_name(spec)}},
        checkpoints,
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]


def container(spec: JobSpec, name: str, ports: list[dict], env: dict[str, str]) -> dict:
    body: dict[str, Any] = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": container_args(spec),
    }
    if env:
        body["env"] = env_list(env)
    body["ports"] = ports
    res = resources(spec)
    if res:
        body["resources"] = res
    body["securityContext"] = container_security_context()
    body["volumeMounts"] = volume_mounts()
    return body


def metrics_port() -> dict:
    return {"name": C.METRICS_PORT_NAME, "containerPort": C.METRICS_PORT, "protocol": "TCP"}


def pod_metadata(spec: JobSpec) -> dict:
    meta: dict[str, Any] = {"labels": labels(spec, "trainer")}
    if spec.istio_opt_out:
        meta["annotations"] = {C.ISTIO_INJECT_ANNOTATION: "false"}
    return meta


def pod_placement(spec: JobSpec) -> dict:
    out: dict[str, Any] = {}
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = copy.deepcopy(spec.tolerations)
    if spec.affinity:
        out["affinity"] = copy.deepcopy(spec.affinity)
    return out


def pod_spec(spec: JobSpec, main: dict, restart_policy: str | None = None) -> dict:
    body: dict[str, Any] = {}
    if spec.service_account:
        body["serviceAccountName"] = spec.service_account
        body["automountServiceAccountToken"] = True
    else:
        body["automountServiceAccountToken"] = False
    if restart_policy:
        body["restartPolicy"] = restart_policy
    if spec.priority_class:
        body["priorityClassName"] = spec.priority_class
    if spec.gang:
        body["schedulerName"] = GANG_SCHEDULERS[spec.gang]
    body["securityContext"] = copy.deepcopy(C.POD_SECURITY_CONTEXT)
    body["terminationGracePeriodSeconds"] = C.TERMINATION_GRACE_PERIOD_SECONDS
    body.update(pod_placement(spec))
    body["containers"] = [main]
    body["volumes"] = volumes(spec)
    return body


def job_labels(spec: JobSpec) -> dict[str, str]:
    return {KUEUE_QUEUE_LABEL: spec.queue} if spec.queue else {}


def build_pytorchjob(spec: JobSpec) -> dict:
    ports = [
        {"name": C.PYTORCHJOB_PORT_NAME, "containerPort": C.PYTORCHJOB_PORT, "protocol": "TCP"},
        metrics_port(),
    ]
    main = container(spec, C.PYTORCHJOB_CONTAINER, ports, spec.env)
    template = {"metadata": pod_metadata(spec), "spec": pod_spec(spec, main)}
    restart = spec.restart_policy or DEFAULT_RESTART_POLICY
    nodes = resolved_nodes(spec)

    def replica(count: int) -> dict:
        return {"replicas": count, "restartPolicy": restart, "template": copy.deepcopy(template)}

    job_spec: dict[str, Any] = {"nprocPerNode": resolved_nproc(spec)}
    if spec.elastic:
        low, high = spec.elastic
        job_spec["elasticPolicy"] = {
            "minReplicas": low,
            "maxReplicas": high,
            "rdzvBackend": "c10d",
            "rdzvId": spec.name,
            "maxRestarts": spec.max_restarts,
        }
        replicas = {"Worker": replica(nodes)}
    else:
        replicas = {"Master": replica(1)}
        if nodes > 1:
            replicas["Worker"] = replica(nodes - 1)
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": spec.clean_pod_policy or DEFAULT_CLEAN_POD_POLICY,
        "backoffLimit": DEFAULT_BACKOFF_LIMIT if spec.backoff_limit is None else spec.backoff_limit,
    }
    if spec.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.gang:
        scheduling: dict[str, Any] = {"minAvailable": spec.elastic[0] if spec.elastic else nodes}
        if spec.priority_class:
            scheduling["priorityClass"] = spec.priority_class
        run_policy["schedulingPolicy"] = scheduling
    job_spec["runPolicy"] = run_policy
    job_spec["pytorchReplicaSpecs"] = replicas
    return {
        "apiVersion": PYTORCHJOB_API,
        "kind": "PyTorchJob",
        "metadata": metadata(spec, spec.name, "job", job_labels(spec)),
        "spec": job_spec,
    }


def build_trainjob(spec: JobSpec) -> dict:
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": list(C.IMAGE_ENTRYPOINT),
        "args": container_args(spec),
    }
    if spec.env:
        trainer["env"] = env_list(spec.env)
    trainer["numNodes"] = resolved_nodes(spec)
    nproc = resolved_nproc(spec)
    if nproc.isdigit():  # "auto": the runtime derives it from the GPU/CPU resources
        trainer["numProcPerNode"] = int(nproc)
    res = resources(spec)
    if res:
        trainer["resourcesPerNode"] = res
    # runtimePatches can set only some pod fields (no priorityClassName, no
    # automountServiceAccountToken, no container ports or imagePullPolicy).
    patch_pod: dict[str, Any] = {}
    if spec.service_account:
        patch_pod["serviceAccountName"] = spec.service_account
    patch_pod["securityContext"] = copy.deepcopy(C.POD_SECURITY_CONTEXT)
    patch_pod["terminationGracePeriodSeconds"] = C.TERMINATION_GRACE_PERIOD_SECONDS
    patch_pod.update(pod_placement(spec))
    patch_pod["containers"] = [
        {
            "name": C.TRAINJOB_CONTAINER,
            "securityContext": container_security_context(),
            "volumeMounts": volume_mounts(),
        }
    ]
    patch_pod["volumes"] = volumes(spec)
    replicated_job = {
        "name": TRAINJOB_REPLICATED_JOB,
        "template": {"spec": {"template": {"metadata": pod_metadata(spec), "spec": patch_pod}}},
    }
    patch = {
        "manager": RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated_job]}}},
    }
    job_spec = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
            "name": TRAINJOB_RUNTIME,
        },
        "trainer": trainer,
        "runtimePatches": [patch],
    }
    return {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": metadata(spec, spec.name, "job", job_labels(spec)),
        "spec": job_spec,
    }


def indexedjob_env(spec: JobSpec) -> dict[str, str]:
    return {
        C.ENV_INDEXEDJOB_MASTER_ADDR: f"{spec.name}-0.{spec.name}",
        C.ENV_INDEXEDJOB_MASTER_PORT: str(C.INDEXEDJOB_PORT),
        C.ENV_INDEXEDJOB_NNODES: str(resolved_nodes(spec)),
        C.ENV_INDEXEDJOB_NPROC: resolved_nproc(spec),
        **spec.env,
    }


def build_indexedjob_service(spec: JobSpec) -> dict:
    """Headless Service: gives pod `<job>-0` the DNS name `<job>-0.<job>` before it is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, spec.name, "rendezvous"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {C.INDEXEDJOB_NAME_LABEL: spec.name},
            "ports": [
                {
                    "name": INDEXEDJOB_PORT_NAME,
                    "port": C.INDEXEDJOB_PORT,
                    "targetPort": C.INDEXEDJOB_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_indexedjob(spec: JobSpec) -> dict:
    ports = [
        {"name": INDEXEDJOB_PORT_NAME, "containerPort": C.INDEXEDJOB_PORT, "protocol": "TCP"},
        metrics_port(),
    ]
    main = container(spec, C.INDEXEDJOB_CONTAINER, ports, indexedjob_env(spec))
    policy = spec.restart_policy or DEFAULT_RESTART_POLICY
    pod = pod_spec(spec, main, "OnFailure" if policy == "OnFailure" else "Never")
    pod = {"subdomain": spec.name, **pod}
    nodes = resolved_nodes(spec)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": DEFAULT_BACKOFF_LIMIT if spec.backoff_limit is None else spec.backoff_limit,
    }
    if spec.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if policy == "ExitCode":
        job_spec["podFailurePolicy"] = {
            "rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": C.INDEXEDJOB_CONTAINER,
                        "operator": "In",
                        "values": list(NON_RETRYABLE_EXIT_CODES),
                    },
                },
            ]
        }
    job_spec["template"] = {"metadata": pod_metadata(spec), "spec": pod}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(spec, spec.name, "job", job_labels(spec)),
        "spec": job_spec,
    }


def build_config_map(spec: JobSpec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(spec, config_map_name(spec), "config"),
        "data": {CONFIG_KEY: trainer_config_text(spec)},
    }


def build_pvc(spec: JobSpec) -> dict:
    pvc_spec: dict[str, Any] = {
        "accessModes": [spec.checkpoint_access_mode],
        "resources": {"requests": {"storage": spec.checkpoint_size}},
    }
    if spec.storage_class:
        pvc_spec["storageClassName"] = spec.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(spec, pvc_name(spec), "checkpoints"),
        "spec": pvc_spec,
    }


def podmonitor_endpoint(kind: str) -> dict:
    if kind == "trainjob":
        # A TrainJob cannot declare the metrics port (runtimePatches has no ports), and
        # Prometheus only discovers declared ports: keep the target of the trainer's declared
        # port and point its address at the metrics port of the same pod.
        return {
            "path": "/metrics",
            "relabelings": [
                {
                    "sourceLabels": [
                        "__meta_kubernetes_pod_container_name",
                        "__meta_kubernetes_pod_container_port_number",
                    ],
                    "regex": f"{C.TRAINJOB_CONTAINER};{C.TRAINJOB_PORT}",
                    "action": "keep",
                },
                {
                    "sourceLabels": ["__meta_kubernetes_pod_ip"],
                    "regex": "(.+)",
                    "targetLabel": "__address__",
                    "replacement": f"$1:{C.METRICS_PORT}",
                },
            ],
        }
    return {"port": C.METRICS_PORT_NAME, "path": "/metrics"}


def build_podmonitor(spec: JobSpec) -> dict:
    return {
        "apiVersion": PODMONITOR_API,
        "kind": "PodMonitor",
        "metadata": metadata(spec, spec.name, "metrics", dict(spec.podmonitor_labels)),
        "spec": {
            "selector": {"matchLabels": {JOB_NAME_LABEL[spec.kind]: spec.name}},
            "podTargetLabels": list(POD_TARGET_LABELS[spec.kind]),
            "podMetricsEndpoints": [podmonitor_endpoint(spec.kind)],
        },
    }


def build_fleet_podmonitor(namespace: str | None = None, extra_labels: dict | None = None) -> dict:
    """One PodMonitor for every kubeddp pod of a namespace (k8s/podmonitor.yaml)."""
    meta: dict[str, Any] = {"name": C.APP_NAME}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {
        C.LABEL_NAME: C.APP_NAME,
        C.LABEL_MANAGED_BY: C.APP_NAME,
        C.LABEL_COMPONENT: "metrics",
        **(extra_labels or {}),
    }
    target_labels = [C.LABEL_INSTANCE]
    for names in POD_TARGET_LABELS.values():
        target_labels += [name for name in names if name not in target_labels]
    return {
        "apiVersion": PODMONITOR_API,
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {C.LABEL_NAME: C.APP_NAME, C.LABEL_COMPONENT: "trainer"}},
            "podTargetLabels": target_labels,
            "podMetricsEndpoints": [podmonitor_endpoint("pytorchjob")],
        },
    }


JOB_BUILDERS = {
    "pytorchjob": build_pytorchjob,
    "trainjob": build_trainjob,
    "indexedjob": build_indexedjob,
}


def build_manifests(spec: JobSpec) -> list[dict]:
    """Every object the job needs, in apply order. Call `check_spec(spec)` first."""
    docs = [build_config_map(spec)]
    if spec.checkpoint_size:
        docs.append(build_pvc(spec))
    if spec.kind == "indexedjob":
        docs.append(build_indexedjob_service(spec))
    docs.append(JOB_BUILDERS[spec.kind](spec))
    if spec.podmonitor:
        docs.append(build_podmonitor(spec))
    return docs


class _Dumper(yaml.SafeDumper):
    """Block style, except long integer lists (exit codes) stay on a few lines; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = len(data) > 8 and all(isinstance(item, int) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None  # the config file stays readable in the ConfigMap
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)


def to_yaml(docs: list[dict]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def to_json(docs: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2) + "\n"
