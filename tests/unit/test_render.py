"""`kubeddp render`: a matrix of options renders manifests that pass validation, with the
defaults the design promises (restricted PSS, container names, ports, /dev/shm, Workers only or
Master 1, checkpoints on a claim).
How each option maps onto a chart value is tested in test_render_options.py."""

from __future__ import annotations

import itertools
import json

import pytest
import yaml

from kubeddp.tools.cli.main import main
from kubeddp.tools.manifests import k8s_names as N
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.validate import validate_documents
from kubeddp.trainer import constants as C
from kubeddp.trainer import exit_codes
from tests.helpers.render import pod_templates, secret_values_masked

FEATURES = {
    "plain": [],
    "pvc": ["--checkpoint-size", "10Gi", "--storage-class", "fast"],
    "claim": ["--checkpoint-pvc", "shared-ckpt"],
    "emptydir": ["--checkpoints-lost-on-retry"],
    "config": ["--set", "train.max_steps=5", "--set", "workload.name=regression"],
    "kueue": ["--queue", "team-a"],
    "podmonitor": ["--podmonitor", "--podmonitor-label", "release=kube-prometheus-stack"],
    "placement": [
        "--node-selector",
        "pool=gpu",
        "--tolerations",
        "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]",
        "--affinity",
        '{"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":'
        ' {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator":'
        ' "Exists"}]}]}}}',
    ],
    "env-sa": ["--env", "NCCL_DEBUG=INFO", "--service-account", "trainer", "--no-istio-opt-out"],
}
PYTORCHJOB_ONLY = {
    "master": ["--master-replica"],
    "gang": ["--gang", "volcano", "--priority-class", "high"],
    "policies": [
        "--restart-policy",
        "OnFailure",
        "--backoff-limit",
        "1",
        "--ttl-seconds-after-finished",
        "600",
        "--clean-pod-policy",
        "All",
    ],
}
SHAPES = {
    "cpu": ["--nodes", "3", "--cpu", "2", "--memory", "4Gi"],
    "gpu": ["--nodes", "2", "--gpus-per-node", "8", "--cpu-limit", "32", "--memory-limit", "256Gi"],
}


# The restricted Pod Security Standard, as the image (uid/gid 1000) needs it.
RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
    "readOnlyRootFilesystem": True,
}


def render(argv: list[str], capsys) -> list[dict]:
    code = main(["render", *argv, "--validate-against", "offline"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [doc for doc in yaml.safe_load_all(out) if doc]


def cases():
    for kind, shape, feature in itertools.product(
        ("pytorchjob", "trainjob", "indexedjob"), SHAPES, [*FEATURES, *PYTORCHJOB_ONLY]
    ):
        if feature in PYTORCHJOB_ONLY and kind != "pytorchjob":
            continue
        yield pytest.param(kind, shape, feature, id=f"{kind}-{shape}-{feature}")
    for feature in FEATURES:
        yield pytest.param("pytorchjob", "elastic", feature, id=f"elastic-{feature}")


def argv_for(kind: str, shape: str, feature: str) -> list[str]:
    options = FEATURES[feature] if feature in FEATURES else PYTORCHJOB_ONLY[feature]
    if shape == "elastic":
        return [kind, "--elastic", "2:4", "--gpus-per-node", "4", *options]
    if kind == "trainjob" and feature == "env-sa":
        options = [o for o in options if o != "--no-istio-opt-out"]
    return [kind, *SHAPES[shape], *options]


def keeper_env(job: str) -> dict[str, str]:
    """A training pod behind the keeper: its address, the secret's file and the pod's grace
    period (the default 10Gi claim, keep 3: test_keeper_manifests.py checks the sums)."""
    return {
        C.ENV_CHECKPOINT_KEEPER: f"http://{job}-keeper:{C.KEEPER_PORT}",
        C.ENV_CHECKPOINT_KEEPER_TOKEN_FILE: f"{C.KEEPER_TOKEN_DIR}/{C.KEEPER_TOKEN_KEY}",
        C.ENV_TERMINATION_GRACE_SECONDS: "213",
    }


def by_kind(docs) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in docs}


def template_nodes(job: dict) -> int:
    """The pods the job runs (elastic: its most)."""
    spec = job["spec"]
    if job["kind"] == "PyTorchJob":
        if "elasticPolicy" in spec:
            return spec["elasticPolicy"]["maxReplicas"]
        return sum(r["replicas"] for r in spec["pytorchReplicaSpecs"].values())
    if job["kind"] == "TrainJob":
        return spec["trainer"]["numNodes"]
    return spec["parallelism"]


@pytest.mark.parametrize(("kind", "shape", "feature"), list(cases()))
def test_rendered_matrix_validates_and_keeps_defaults(kind, shape, feature, capsys):
    docs = render(argv_for(kind, shape, feature), capsys)
    assert validate_documents(docs) == []
    kinds = [doc["kind"] for doc in docs]
    assert kinds[0] == "ConfigMap"
    job = docs[
        kinds.index({"pytorchjob": "PyTorchJob", "trainjob": "TrainJob", "indexedjob": "Job"}[kind])
    ]
    for doc in docs:
        assert set(doc["metadata"]["labels"]) >= {
            N.LABEL_NAME,
            N.LABEL_INSTANCE,
            N.LABEL_MANAGED_BY,
            N.LABEL_COMPONENT,
        }
    claim = feature != "emptydir"  # a claim unless asked otherwise: retries keep progress
    pvcs = [doc for doc in docs if doc["kind"] == "PersistentVolumeClaim"]
    assert len(pvcs) == (claim and feature != "claim")
    # several pods: a keeper pod holds the claim (ReadWriteOnce is enough), the training pods
    # keep the checkpoints on an emptyDir synced with it
    keeper = [doc for doc in docs if doc["kind"] == "Deployment"]
    assert bool(keeper) == (claim and template_nodes(job) > 1), [d["kind"] for d in docs]
    mounted = claim and not keeper
    for template in pod_templates(job):
        pod = template["spec"]
        # OnRootMismatch: no recursive chown of a large checkpoint claim at each pod start
        on_claim = {"fsGroupChangePolicy": "OnRootMismatch"} if mounted else {}
        assert pod["securityContext"] == {**RESTRICTED_POD, **on_claim}
        checkpoints = {v["name"]: v for v in pod["volumes"]}["checkpoints"]
        assert ("persistentVolumeClaim" in checkpoints) is mounted, checkpoints
        # behind a keeper the grace also holds the send of a checkpoint (test_keeper_manifests)
        grace = pod["terminationGracePeriodSeconds"]
        assert (grace == N.TERMINATION_GRACE_PERIOD_SECONDS) is not bool(keeper), grace
        assert grace > C.PREEMPT_GRACE_SECONDS
        (container,) = pod["containers"]
        assert container["securityContext"] == RESTRICTED_CONTAINER
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        secret = {C.KEEPER_TOKEN_DIR} if keeper else set()  # the keeper's secret, read-only
        assert set(mounts) == {"/dev/shm", C.SCRATCH_DIR, C.CHECKPOINT_DIR, N.CONFIG_DIR, *secret}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        assert volumes["config"]["configMap"]["name"] == docs[0]["metadata"]["name"]
        annotations = template["metadata"].get("annotations", {})
        assert (annotations.get(N.ISTIO_INJECT_ANNOTATION) == "false") == (
            feature != "env-sa" or kind == "trainjob"
        )
        if kind != "trainjob":
            assert container["imagePullPolicy"] == "IfNotPresent"
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports[N.METRICS_PORT_NAME] == C.METRICS_PORT
            assert pod["automountServiceAccountToken"] is (feature == "env-sa")
            assert container["args"][:3] == ["--", "--config", C.CONFIG_FILE]
    if kind == "pytorchjob":
        for template in pod_templates(job):
            (container,) = template["spec"]["containers"]
            assert container["name"] == KINDS["pytorchjob"].container
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports[KINDS["pytorchjob"].rendezvous_port_name] == C.PYTORCHJOB_PORT
        assert isinstance(job["spec"]["nprocPerNode"], str)
    if feature == "podmonitor":
        monitor = by_kind(docs)["PodMonitor"]
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        (label,) = monitor["spec"]["selector"]["matchLabels"]
        assert label in monitor["spec"]["podTargetLabels"]
    if feature == "kueue":
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    if pvcs:
        (pvc,) = pvcs
        nodes = 4 if shape == "elastic" else int(SHAPES[shape][1])
        assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
        assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"], nodes  # keeper or one pod
    if kind == "trainjob":  # the count kubeddp means, never the runtime's CPU-derived default
        gpus = 8 if shape == "gpu" else 0
        assert job["spec"]["trainer"]["numProcPerNode"] == (gpus or 1)


@pytest.mark.parametrize("nodes", [1, 3])
def test_pytorchjob_is_workers_only_by_default(nodes, capsys):
    """No Master: training-operator v1.9 adds no init-pytorch container; worker-0 is rank 0."""
    job = by_kind(render(["pytorchjob", "--name", "pt", "--nodes", str(nodes)], capsys))
    replicas = job["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Worker"]
    assert replicas["Worker"]["replicas"] == nodes
    assert replicas["Worker"]["restartPolicy"] == "ExitCode"
    (container,) = replicas["Worker"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env == {
        C.ENV_MASTER_ADDR: "pt-worker-0",
        C.ENV_MASTER_PORT: str(C.PYTORCHJOB_PORT),
        C.ENV_NNODES: str(nodes),
        C.ENV_NODE_RANK: {
            "fieldRef": {"fieldPath": "metadata.labels['training.kubeflow.org/replica-index']"}
        },
        **(keeper_env("pt") if nodes > 1 else {}),
        C.ENV_SNAPSHOT_DIR: C.POD_SNAPSHOT_DIR,
        **{name: {"fieldRef": {"fieldPath": path}} for name, path in C.DOWNWARD_ENV.items()},
    }
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(("nodes", "workers"), [(1, None), (2, 1), (5, 4)])
def test_pytorchjob_master_is_one_and_written_workers_are_n_minus_one(nodes, workers, capsys):
    argv = ["render", "pytorchjob", "--nodes", str(nodes), "--master-replica"]
    assert main([*argv, "--validate-against", "offline"]) == 0
    out, err = capsys.readouterr()
    replicas = by_kind(yaml.safe_load_all(out))["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert replicas["Master"]["restartPolicy"] == "ExitCode"
    assert replicas.get("Worker", {}).get("replicas") == workers
    for replica in replicas.values():
        (container,) = replica["template"]["spec"]["containers"]
        # the operator sets MASTER_ADDR, RANK, WORLD_SIZE...; kubeddp only the keeper's and the
        # pod/node names
        env = {e["name"] for e in container.get("env", [])}
        assert env == {*C.DOWNWARD_ENV, C.ENV_SNAPSHOT_DIR, *(keeper_env("x") if nodes > 1 else [])}
    # One line: what the operator adds, what breaks, and both fixes.
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    for word in ("init-pytorch", "restricted", "air-gapped", "--pytorch-init-container-image",
                 "--pytorch-init-container-template-file", "leave the Master out"):  # fmt: skip
        assert word in warning, warning


def test_checkpoints_on_one_pod_are_read_write_once(capsys):
    docs = by_kind(render(["indexedjob", "--nodes", "1"], capsys))
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_elastic_pytorchjob_has_only_workers_and_c10d(capsys):
    job = by_kind(render(["pytorchjob", "--elastic", "2:4", "--name", "el"], capsys))["PyTorchJob"]
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    assert job["spec"]["elasticPolicy"] == {
        "minReplicas": 2,
        "maxReplicas": 4,
        "rdzvBackend": "c10d",
        "rdzvId": "el",
        "maxRestarts": 3,
    }


def test_gang_scheduling_sets_scheduler_and_min_available(capsys):
    argv = ["pytorchjob", "--nodes", "3", "--gang", "scheduler-plugins"]
    job = by_kind(render(argv, capsys))["PyTorchJob"]
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3}
    for template in pod_templates(job):
        assert template["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_indexedjob_has_headless_service_and_rendezvous_env(capsys):
    docs_list = render(
        ["indexedjob", "--name", "ix", "--nodes", "3", "--nproc-per-node", "2"], capsys
    )
    docs = by_kind(docs_list)
    job = docs["Job"]
    (service,) = [d for d in docs_list if d["kind"] == "Service" and d["metadata"]["name"] == "ix"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {KINDS["indexedjob"].job_name_label: "ix"}
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == "ix"
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    assert env == {
        C.ENV_MASTER_ADDR: "ix-0.ix",
        C.ENV_MASTER_PORT: str(C.INDEXEDJOB_PORT),
        C.ENV_NNODES: "3",
        C.ENV_NPROC_PER_NODE: "2",
        **keeper_env("ix"),  # 3 pods: the keeper
        C.ENV_SNAPSHOT_DIR: C.POD_SNAPSHOT_DIR,
    }
    assert pod["containers"][0]["name"] == KINDS["indexedjob"].container
    ignored, counted, failing = job["spec"]["podFailurePolicy"]["rules"]
    # The preempted pod (DisruptionTarget) and what its peers end with are not counted...
    assert ignored == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert counted["action"] == "Ignore" and counted["onExitCodes"]["operator"] == "In"
    assert counted["onExitCodes"]["values"] == [
        exit_codes.PREEMPTED,
        exit_codes.RDZV_UNREACHABLE,
        exit_codes.PEER_FAILED,
    ]  # sorted, as the API requires
    # ... the program's own failures end the job; the rest (KILLED, crashes) are counted.
    assert failing["action"] == "FailJob"
    assert failing["onExitCodes"]["values"] == list(range(1, 128))
    assert exit_codes.KILLED not in counted["onExitCodes"]["values"]


def test_trainjob_runs_on_its_own_torch_runtime_with_a_gang_failure_policy(capsys):
    docs = by_kind(render(["trainjob", "--nodes", "2", "--gpus-per-node", "4"], capsys))
    job, runtime = docs["TrainJob"], docs["TrainingRuntime"]
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": runtime["metadata"]["name"],
    }
    assert job["spec"]["trainer"]["numNodes"] == 2
    assert job["spec"]["trainer"]["numProcPerNode"] == 4
    (container,) = pod_templates(job)[0]["spec"]["containers"]
    assert container["name"] == KINDS["trainjob"].container
    jobset = runtime["spec"]["template"]["spec"]
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
    assert jobset["failurePolicy"]["maxRestarts"] == 3
    assert jobset["failurePolicy"]["rules"][0]["action"] == "FailJobSet"
    (replicated,) = jobset["replicatedJobs"]
    batch = replicated["template"]["spec"]
    assert batch["template"]["spec"]["restartPolicy"] == "Never"
    actions = [rule["action"] for rule in batch["podFailurePolicy"]["rules"]]
    assert actions == ["Ignore", "Ignore", "FailJob"]
    (runtime_container,) = batch["template"]["spec"]["containers"]
    assert runtime_container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_trainjob_on_an_installed_runtime(capsys):
    argv = ["trainjob", "--no-own-runtime", "--runtime-kind", "ClusterTrainingRuntime"]
    docs = by_kind(render(argv, capsys))
    assert "TrainingRuntime" not in docs
    assert docs["TrainJob"]["spec"]["runtimeRef"]["name"] == "torch-distributed"


def test_config_file_ships_in_configmap_and_overrides_follow_it(tmp_path, capsys):
    config = tmp_path / "train.yaml"
    config.write_text("workload:\n  name: regression\ntrain:\n  max_steps: 7\n  lr: 0.5\n")
    argv = [
        "pytorchjob",
        "--config",
        str(config),
        "--set",
        "train.lr=1e-2",
        "--set",
        "train.amp=off",
    ]
    docs = by_kind(render(argv, capsys))
    shipped = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])
    assert shipped["workload"] == {"name": "regression"}
    # --set wins over the file, typed as the trainer reads it (YAML 1.1: 1e-2 and off are not
    # a float and a string)
    assert shipped["train"] == {"max_steps": 7, "lr": 0.01, "amp": "off"}
    assert shipped["checkpoint"]["dir"] == C.CHECKPOINT_DIR
    template = pod_templates(docs["PyTorchJob"])[0]
    assert template["spec"]["containers"][0]["args"] == ["--", "--config", C.CONFIG_FILE]


def test_checkpoint_dir_can_be_set(capsys):
    docs = by_kind(render(["pytorchjob", "--set", "checkpoint.dir=/checkpoints/run1"], capsys))
    shipped = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])
    assert shipped == {"checkpoint": {"dir": "/checkpoints/run1"}}


def test_json_output_is_a_list_of_the_same_objects(capsys):
    as_yaml = render(["indexedjob", "--nodes", "2"], capsys)
    assert (
        main(
            ["render", "indexedjob", "--nodes", "2", "-o", "json", "--validate-against", "offline"]
        )
        == 0
    )
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["kind"] == "List"
    assert secret_values_masked(as_json["items"]) == secret_values_masked(as_yaml)


def test_render_is_deterministic_but_for_a_new_keeper_secret(capsys):
    argv = ["render", "pytorchjob", "--nodes", "2", "--podmonitor", "--validate-against", "offline"]
    main(argv)
    first = list(yaml.safe_load_all(capsys.readouterr().out))
    main(argv)
    second = list(yaml.safe_load_all(capsys.readouterr().out))
    assert secret_values_masked(second) == secret_values_masked(first)
    tokens = [
        doc["data"][C.KEEPER_TOKEN_KEY] for doc in (*first, *second) if doc["kind"] == "Secret"
    ]
    assert len(tokens) == len(set(tokens)) == 2  # 32 random bytes each time (masked: above)
