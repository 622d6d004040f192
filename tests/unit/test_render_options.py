"""Every `kubeddp render` option lands on its chart value (and shows in the objects), and every
chart value has an option: render and `helm install` take the same settings."""

from __future__ import annotations

import pytest
import yaml

from kubeddp.tools.cli.main import parse_command
from kubeddp.tools.manifests.chart.render_options import values_from_args
from kubeddp.tools.manifests.chart.values import FLAGS, NOT_FLAGS, VALUES, flag_sets
from tests.helpers.kind_samples import derived_case
from tests.helpers.render import render_job

pytestmark = pytest.mark.timeout(120)
SECRET_ENV = "[{name: TOKEN, valueFrom: {secretKeyRef: {name: hf, key: token}}}]"
TOLERATION = "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]"
AFFINITY = "{podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: []}}"
DIGEST = "sha256:" + "a" * 64

# option: (arguments after `render pytorchjob`, the chart values they must set). An option
# that sets its one value as given gets its case from that value's sample (see `derived_case`);
# one with `sets=` or `convert=` (or a case worth spelling out) is written here.
LANDS_ON = {
    "KIND": ([], {"kind": "PyTorchJob"}),
    "--name": (["--name", "job-a"], {"fullnameOverride": "job-a"}),
    "--namespace": (["-n", "team"], {"namespaceOverride": "team"}),
    "--image": (
        ["--image", "reg:5000/org/img:v2"],
        {"image": {"repository": "reg:5000/org/img", "tag": "v2", "digest": ""}},
    ),
    "--image-pull-policy": (["--image-pull-policy", "Always"], {"image": {"pullPolicy": "Always"}}),
    "--image-pull-secret": (
        ["--image-pull-secret", "a", "--image-pull-secret", "b"],
        {"imagePullSecrets": [{"name": "a"}, {"name": "b"}]},
    ),
    "--nnodes": (["--nnodes", "3"], {"nodes": 3}),
    "--nproc-per-node": (["--nproc-per-node", "cpu"], {"nprocPerNode": "cpu"}),
    "--gpus-per-node": (["--gpus-per-node", "8"], {"gpusPerNode": 8}),
    "--resources": (
        ["--resources", "{limits: {ephemeral-storage: 10Gi}}"],
        {"resources": {"limits": {"ephemeral-storage": "10Gi"}}},
    ),
    "--cpu": (["--cpu", "8"], {"resources": {"requests": {"cpu": "8"}}}),
    "--memory": (["--memory", "64Gi"], {"resources": {"requests": {"memory": "64Gi"}}}),
    "--cpu-limit": (["--cpu-limit", "9"], {"resources": {"limits": {"cpu": "9"}}}),
    "--memory-limit": (["--memory-limit", "1Gi"], {"resources": {"limits": {"memory": "1Gi"}}}),
    "--shm-size": (["--shm-size", "1Gi"], {"shmSize": "1Gi"}),
    "--elastic": (
        ["--elastic", "2:5"],
        {"elastic": {"enabled": True, "minNodes": 2, "maxNodes": 5}},
    ),
    "--rdzv-id": (["--rdzv-id", "run-7"], {"elastic": {"rdzvId": "run-7"}}),
    "--max-restarts": (["--max-restarts", "9"], {"elastic": {"maxRestarts": 9}}),
    "--restart-policy": (["--restart-policy", "Never"], {"restartPolicy": "Never"}),
    "--backoff-limit": (["--backoff-limit", "0"], {"backoffLimit": 0}),
    "--ttl-seconds-after-finished": (
        ["--ttl-seconds-after-finished", "60"],
        {"ttlSecondsAfterFinished": 60},
    ),
    "--clean-pod-policy": (["--clean-pod-policy", "All"], {"cleanPodPolicy": "All"}),
    "--termination-grace-period-seconds": (
        ["--termination-grace-period-seconds", "300"],
        {"terminationGracePeriodSeconds": 300},
    ),
    "--runtime-name": (["--runtime-name", "my-rt"], {"trainJob": {"runtimeName": "my-rt"}}),
    "--runtime-kind": (
        ["--runtime-kind", "TrainingRuntime"],
        {"trainJob": {"runtimeKind": "TrainingRuntime"}},
    ),
    "--env": (["--env", "A=1", "--env", "B=x=y"], {"env": {"A": "1", "B": "x=y"}}),
    "--extra-env": (
        ["--extra-env", SECRET_ENV],
        {
            "extraEnv": [
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
            ]
        },
    ),
    "--env-secret": (
        ["--env-secret", "HF_TOKEN=hub:token", "--env-secret", "B=s:k"],
        {
            "extraEnv": [
                {
                    "name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}},
                },
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            ]
        },
    ),
    "--env-from": (
        ["--env-from", "secret:s3", "--env-from", "configmap:settings"],
        {"envFrom": [{"secretRef": {"name": "s3"}}, {"configMapRef": {"name": "settings"}}]},
    ),
    "--volume": (
        ["--volume", "claim:datasets:/data:ro", "--volume", "secret:creds:/etc/creds"],
        {
            "volumes": [
                {
                    "name": "vol-data",
                    "mountPath": "/data",
                    "persistentVolumeClaim": {"claimName": "datasets"},
                    "readOnly": True,
                },
                {
                    "name": "vol-etc-creds",
                    "mountPath": "/etc/creds",
                    "secret": {"secretName": "creds"},
                },
            ]
        },
    ),
    "--volumes": (
        ["--volumes", "[{name: m, mountPath: /models, csi: {driver: d.csi.io}}]"],
        {"volumes": [{"name": "m", "mountPath": "/models", "csi": {"driver": "d.csi.io"}}]},
    ),
    "--script": (["--script", "/app/train.py"], {"trainer": {"script": "/app/train.py"}}),
    "--module": (["--module", "mypkg.train"], {"trainer": {"module": "mypkg.train"}}),
    "--spawns-workers": (["--no-spawns-workers"], {"trainer": {"spawnsWorkers": False}}),
    "-- ARGS": (
        ["--module", "m", "--", "--lr=${local_rank}", "two words", "--"],
        {"trainer": {"module": "m", "args": ["--lr=${local_rank}", "two words", "--"]}},
    ),
    "--pod-annotation": (["--pod-annotation", "a.io/b=c"], {"podAnnotations": {"a.io/b": "c"}}),
    "--pod-label": (["--pod-label", "team=ml"], {"podLabels": {"team": "ml"}}),
    "--node-selector": (["--node-selector", "pool=gpu"], {"nodeSelector": {"pool": "gpu"}}),
    "--tolerations": (
        ["--tolerations", TOLERATION],
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    ),
    "--affinity": (
        ["--affinity", AFFINITY],
        {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
    ),
    "--priority-class": (["--priority-class", "high"], {"priorityClassName": "high"}),
    "--istio-opt-out": (["--no-istio-opt-out"], {"istio": {"optOut": False}}),
    "--queue": (["--queue", "team-a"], {"kueue": {"queueName": "team-a"}}),
    "--gang": (["--gang", "volcano"], {"gang": {"scheduler": "volcano"}}),
    "--gang-queue": (["--gang-queue", "research"], {"gang": {"queue": "research"}}),
    "--pod-security-context": (
        ["--pod-security-context", "{runAsUser: 2000}"],
        {"podSecurityContext": {"runAsUser": 2000}},
    ),
    "--security-context": (
        ["--security-context", "{privileged: false}"],
        {"securityContext": {"privileged": False}},
    ),
    "--create-service-account": (
        ["--create-service-account"],
        {"serviceAccount": {"create": True}},
    ),
    "--service-account": (["--service-account", "sa"], {"serviceAccount": {"name": "sa"}}),
    "--service-account-annotation": (
        ["--service-account-annotation", "iam/role=r"],
        {"serviceAccount": {"annotations": {"iam/role": "r"}}},
    ),
    "--config": (["--config", "CONFIG_FILE"], {"config": {"train": {"epochs": 2}}}),
    "--set": (["--set", "train.lr=3e-4"], {"config": {"train": {"lr": 3e-4}}}),
    "--checkpoint-pvc": (["--checkpoint-pvc", "ckpt"], {"checkpoints": {"existingClaim": "ckpt"}}),
    "--checkpoint-size": (["--checkpoint-size", "5Gi"], {"checkpoints": {"size": "5Gi"}}),
    "--storage-class": (["--storage-class", "fast"], {"checkpoints": {"storageClassName": "fast"}}),
    "--checkpoint-access-mode": (
        ["--checkpoint-access-mode", "ReadWriteOnce"],
        {"checkpoints": {"accessMode": "ReadWriteOnce"}},
    ),
    "--checkpoint-storage": (
        ["--checkpoint-storage", "keeper"],
        {"checkpoints": {"storage": "keeper"}},
    ),
    "--checkpoints-lost-on-retry": (
        ["--checkpoints-lost-on-retry"],
        {"checkpoints": {"lostOnRetry": True}},
    ),
    "--master-replica": (["--master-replica"], {"pytorchJob": {"masterReplica": True}}),
    "--own-runtime": (["--no-own-runtime"], {"trainJob": {"ownRuntime": False}}),
    "--podmonitor": (["--podmonitor"], {"monitoring": {"podMonitor": {"enabled": True}}}),
    "--podmonitor-label": (
        ["--podmonitor-label", "release=kps"],
        {"monitoring": {"podMonitor": {"labels": {"release": "kps"}}}},
    ),
    "--podmonitor-interval": (
        ["--podmonitor-interval", "15s"],
        {"monitoring": {"podMonitor": {"interval": "15s"}}},
    ),
    "--dashboard": (["--dashboard"], {"monitoring": {"dashboard": {"enabled": True}}}),
    "--dashboard-label": (
        ["--dashboard-label", "team=ml"],
        {"monitoring": {"dashboard": {"labels": {"team": "ml"}}}},
    ),
}


CASES = {
    **{
        flag.name: case
        for flag, value in FLAGS
        if (case := derived_case(flag, value.path)) is not None
    },
    **LANDS_ON,
}


def values_for(arguments: list[str], tmp_path) -> tuple[dict, dict]:
    config = tmp_path / "train.yaml"
    config.write_text("train:\n  epochs: 2\n")
    arguments = [str(config) if a == "CONFIG_FILE" else a for a in arguments]
    return values_from_args(parse_command(["render", "pytorchjob", *arguments]))


def contains(values: dict, expected: dict) -> bool:
    for key, want in expected.items():
        if isinstance(want, dict) and want:
            if not isinstance(values.get(key), dict) or not contains(values[key], want):
                return False
        elif values.get(key, object()) != want:
            return False
    return True


def test_every_option_has_a_case() -> None:
    """An option with `sets=`/`convert=` needs its LANDS_ON entry; the others, a sample."""
    assert sorted(CASES) == sorted(flag.name for flag, _ in FLAGS)


@pytest.mark.parametrize("option", CASES)
def test_option_lands_on_its_value(option: str, tmp_path) -> None:
    arguments, expected = CASES[option]
    values, provenance = values_for(arguments, tmp_path)
    assert contains(values, expected), values
    if option != "KIND":
        assert option in provenance.values()


@pytest.mark.parametrize(
    ("arguments", "same_as"),
    [(["--nnodes", "3"], ["--nodes", "3"]), (["--nnodes", "2:5"], ["--elastic", "2:5"]),
     (["--nodes", "2:5"], ["--elastic", "2:5"])],
    ids=str,
)  # fmt: skip
def test_nnodes_is_torchruns_option_and_nodes_its_old_name(
    arguments: list[str], same_as: list[str], tmp_path
) -> None:
    """`render --nnodes` as `train --nnodes`: N pods, or MIN:MAX for an elastic job."""
    assert values_for(arguments, tmp_path)[0] == values_for(same_as, tmp_path)[0]


def test_every_value_is_set_by_an_option() -> None:
    """Except what Helm owns (nameOverride) and what render fixes (managedBy)."""
    reached = {path for flag, value in FLAGS for path in flag_sets(flag, value)}
    unreached = [v.path for v in VALUES if v.path not in reached and v.path not in NOT_FLAGS]
    assert unreached == []
    assert all(not value.flags for value in VALUES if value.path in NOT_FLAGS)


def test_only_given_options_become_values(tmp_path) -> None:
    """The chart's defaults do the rest; render adds its job name and managedBy only."""
    values, _ = values_for([], tmp_path)
    assert values == {"kind": "PyTorchJob", "fullnameOverride": "kubeddp", "managedBy": "kubeddp"}


def test_image_reference_forms(tmp_path) -> None:
    for reference, expected in {
        "kubeddp:cpu": ("kubeddp", "cpu", ""),
        "localhost:5000/x": ("localhost:5000/x", "latest", ""),
        f"ghcr.io/a/b@{DIGEST}": ("ghcr.io/a/b", "", DIGEST),
    }.items():
        image = values_for(["--image", reference], tmp_path)[0]["image"]
        assert (image["repository"], image["tag"], image["digest"]) == expected


def pod_spec(docs: list[dict]) -> dict:
    (job,) = [d for d in docs if d["kind"] == "PyTorchJob"]
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]


def test_settings_only_the_chart_had_reach_the_objects() -> None:
    docs = render_job(
        "pytorchjob",
        "--name", "demo",
        "-n", "team",
        "--image", f"ghcr.io/a/b@{DIGEST}",
        "--image-pull-secret", "regcred",
        "--pod-label", "team=ml",
        "--pod-annotation", "note=x",
        "--extra-env", SECRET_ENV,
        "--gang", "volcano",
        "--gang-queue", "research",
        "--termination-grace-period-seconds", "300",
        "--create-service-account",
        "--podmonitor", "--podmonitor-interval", "30s",
        "--dashboard", "--dashboard-label", "team=ml",
    )  # fmt: skip
    kinds = [doc["kind"] for doc in docs]
    assert kinds == [
        "ServiceAccount", "ConfigMap", "ConfigMap", "PersistentVolumeClaim", "PyTorchJob",
        "PodMonitor",
    ]  # fmt: skip
    assert {doc["metadata"]["namespace"] for doc in docs} == {"team"}
    template = pod_spec(docs)
    pod = template["spec"]
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false", "note": "x"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["terminationGracePeriodSeconds"] == 300
    assert pod["serviceAccountName"] == "demo" and pod["automountServiceAccountToken"] is True
    assert pod["schedulerName"] == "volcano"
    (container,) = pod["containers"]
    assert container["image"] == f"ghcr.io/a/b@{DIGEST}"
    assert container["env"][-1]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    job = docs[4]
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["queue"] == "research"
    assert docs[5]["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"
    dashboard = docs[2]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["labels"]["team"] == "ml"
    assert all(name.endswith(".json") for name in dashboard["data"])


def test_trainjob_runtime_options_reach_the_runtime_ref() -> None:
    (job,) = [
        d
        for d in render_job(
            "trainjob",
            "--no-own-runtime",
            "--runtime-name",
            "my-rt",
            "--runtime-kind",
            "TrainingRuntime",
        )
        if d["kind"] == "TrainJob"
    ]
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "my-rt",
    }


def test_rendered_objects_are_plain_manifests() -> None:
    """No Helm labels, hooks or keep-annotations in what `kubectl apply` gets."""
    docs = render_job("indexedjob", "--checkpoint-size", "1Gi", "--podmonitor")
    text = yaml.safe_dump_all(docs)
    assert "helm.sh" not in text and "Helm" not in text
    assert [doc["kind"] for doc in docs] == [
        "ConfigMap",
        "PersistentVolumeClaim",
        "Service",
        "Job",
        "PodMonitor",
    ]
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubeddp"
        assert "namespace" not in doc["metadata"]


def test_list_options_add_up(tmp_path) -> None:
    """--volume and --volumes (and --extra-env and --env-secret) fill one list together."""
    values, _ = values_for(
        [
            "--volume", "claim:a:/a", "--volumes", "[{name: b, mountPath: /b, emptyDir: {}}]",
            "--extra-env", SECRET_ENV, "--env-secret", "B=s:k",
        ],
        tmp_path,
    )  # fmt: skip
    assert [v["name"] for v in values["volumes"]] == ["vol-a", "b"]
    assert [e["name"] for e in values["extraEnv"]] == ["TOKEN", "B"]
