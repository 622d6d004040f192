"""The table of bad inputs: what an adversarial user gives kubeddp, and the exit code each must
end with (trainer/exit_codes.py), always as exactly one line on stderr and never a traceback.

A row is a command line, plus what it needs: files (written under the test's tmp dir and named
`{tmp}/NAME` in the command), an environment for `kubeddp launch`, or a stand-in API server
(tests/helpers/fake_api.py) that answers normally or misbehaves. tests/unit/test_bad_inputs.py
runs every row in process; tests/integration/test_bad_input.py runs a subset as real processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import yaml

from kubeddp.trainer.config import config_fields
from kubeddp.trainer.exit_codes import BAD_INPUT, CLUSTER_ERROR, TRAINING_FAILED
from tests.helpers import fake_api

PROBLEMS_FOUND = TRAINING_FAILED  # `kubeddp validate`: the manifests have problems


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]
    code: int
    mentions: tuple[str, ...] = ()  # words the one stderr line must contain
    files: dict[str, bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # launch: the whole rendezvous env
    api: str | None = None  # None: no server; "ok": answers routes; else a misbehaviour
    api_untouched: bool = False  # the server must receive no request at all
    in_tmp: bool = False  # run in the tmp dir (where the row's files are)
    must_not_exist: tuple[str, ...] = ()  # files (under tmp) the command must never make
    fifos: tuple[str, ...] = ()  # named pipes made under tmp, with no writer
    stdout: str | None = None  # "full" (/dev/full), "closed" or "broken-pipe"; None: captured
    training: bool = False  # a real training run: only as a process (test_bad_input.py)
    notes: tuple[str, ...] = ()  # starts of informational stderr lines that may precede the one


def error_lines(row: Row, err: str) -> list[str]:
    """The stderr lines that count: all but the row's informational notes."""
    return [line for line in err.splitlines() if line.strip() and not line.startswith(row.notes)]


def _text(value: str) -> bytes:
    return value.encode()


RENDER = ("render", "pytorchjob", "--validate-against", "offline")


# ---- the trainer config: every numeric key x its edge values ------------------------------


def _edge_values(meta: dict, typ: type) -> list[tuple[str, str]]:
    """(label, YAML text) of values outside the key's range, and non-finite ones."""
    out = []
    if "above" in meta:
        out.append(("at-exclusive-min", str(meta["above"])))
        out.append(("negative", "-1"))
    elif "minimum" in meta:
        low = meta["minimum"]
        out.append(("below-min", str(low - 1) if typ is int else str(low - 0.5)))
    if "maximum" in meta:
        high = meta["maximum"]
        out.append(("above-max", str(high + 1) if typ is int else str(high * 2 + 1)))
    if typ is float:
        out += [("nan", ".nan"), ("inf", ".inf"), ("minus-inf", "-.inf"), ("nan-word", "nan")]
    else:
        out += [("float", "1.5"), ("nan", ".nan"), ("text", "many")]
    return out


def config_rows() -> list[Row]:
    rows = []
    for path, typ, item in config_fields():
        if typ not in (int, float):
            continue
        for label, value in _edge_values(dict(item.metadata), typ):
            rows.append(
                Row(
                    f"set-{path}-{label}", (*RENDER, "--set", f"{path}={value}"), BAD_INPUT, (path,)
                )
            )
    # The edge values of issue 14 by name, through `kubeddp train` (launch checks the config
    # before it starts anything).
    for setting in (
        "train.max_steps=-1",
        "workload.n_head=0",
        "workload.n_head=-2",
        "ddp.timeout_seconds=0",
        "ddp.startup_timeout_seconds=-5",
        "checkpoint.preempt_grace_seconds=0",
        "train.prefetch_factor=0",
        "train.lr=.nan",
        "ddp.bucket_cap_mb=.inf",
        "workload.n_embd=130",  # not a multiple of n_head (4)
    ):
        key = setting.split("=")[0]
        rows.append(Row(f"train-{setting}", ("train", "--set", setting), BAD_INPUT, (key,)))
    return rows


# ---- files that are not (bounded, plain) YAML --------------------------------------------

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
)
BAD_FILES: dict[str, tuple[bytes, str]] = {  # name -> (content, a word of the error)
    "binary": (bytes(range(256)) * 4, "not a text file"),
    "latin1": ("train:\n  lr: 0.1 # d\xe9j\xe0\n".encode("latin-1"), "not UTF-8"),
    "nul": (b"train:\n  lr: 0.1\0\n", "not a text file"),
    "deep-flow": (_text("[" * 5000 + "]" * 5000), "deeper than"),
    "deep-block": (_text("".join("  " * i + f"k{i}:\n" for i in range(300))), "deeper than"),
    "laughs": (_text(LAUGHS), "aliases expand"),
    "recursive-alias": (_text("a: &a [*a]\n"), "refers to its own anchor"),
    "duplicate-key": (_text("train:\n  lr: 0.1\n  lr: 0.2\n"), "'lr' is given twice"),
    "duplicate-section": (_text("train: {}\nddp: {}\ntrain: {}\n"), "'train' is given twice"),
    "binary-tag": (_text("train: !!binary aGVsbG8=\n"), "!!binary"),
    "python-tag": (_text("train: !!python/object:os.system [ls]\n"), "not valid YAML"),
    "huge-int": (_text("train:\n  seed: " + "9" * 5000 + "\n"), "cannot be read"),
    "syntax": (_text("train:\n  lr: [0.1\n"), "not valid YAML"),
    "tab": (_text("train:\n\tlr: 0.1\n"), "not valid YAML"),
}
NOT_A_MAPPING: dict[str, bytes] = {
    "top-list": b"- train\n- ddp\n",
    "top-scalar": b"42\n",
    "section-list": b"train: [1, 2]\n",
}


def file_rows() -> list[Row]:
    rows = []
    for name, (content, word) in BAD_FILES.items():
        files = {"f.yaml": content}
        rows += [
            Row(f"render-config-{name}", (*RENDER, "--config", "{tmp}/f.yaml"), 2, (word,), files),
            Row(f"train-config-{name}", ("train", "--config", "{tmp}/f.yaml"), 2, (word,), files),
            Row(f"validate-{name}", ("validate", "{tmp}/f.yaml"), 2, (word,), files),
            Row(f"affinity-{name}", (*RENDER, "--affinity", "{tmp}/f.yaml"), 2, (word,), files),
            Row(f"kubeconfig-{name}", ("status", "demo", "--kubeconfig", "{tmp}/f.yaml"), 3,
                (word,), files),
        ]  # fmt: skip
    for name, content in NOT_A_MAPPING.items():
        files = {"f.yaml": content}
        rows.append(
            Row(f"train-config-{name}", ("train", "--config", "{tmp}/f.yaml"), 2, (), files)
        )
        rows.append(
            Row(f"render-config-{name}", (*RENDER, "--config", "{tmp}/f.yaml"), 2, (), files)
        )
    missing = "{tmp}/missing.yaml"
    rows += [
        Row("train-config-missing", ("train", "--config", missing), 2, ("cannot read",)),
        Row("train-config-directory", ("train", "--config", "{tmp}"), 2, ("cannot read",)),
        Row("render-config-missing", (*RENDER, "--config", missing), 2, ("cannot read",)),
        Row("render-config-directory", (*RENDER, "--config", "{tmp}"), 2, ("cannot read",)),
        Row("validate-missing", ("validate", missing), 2, ("cannot read",)),
        Row("validate-directory", ("validate", "{tmp}"), 2, ("cannot read",)),
        Row("affinity-long-inline",
            (*RENDER, "--affinity", '{"nodeAffinity": "' + "x" * 300 + '"}'), 2, ("--affinity",)),
        Row("affinity-inline-list", (*RENDER, "--affinity", "[1, 2]"), 2, ("dict",)),
        Row("affinity-inline-laughs", (*RENDER, "--affinity", LAUGHS), 2, ("aliases expand",)),
        Row("set-value-laughs", (*RENDER, "--set", "workload.corpus=" + LAUGHS.replace("\n", " ")),
            2, ("workload.corpus",)),
    ]  # fmt: skip
    return rows


# ---- the launcher's environment ----------------------------------------------------------

ENV_ROWS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "trainjob-without-node-rank": (
        {"PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_NNODES": "2"},
        ("PET_NODE_RANK",),
    ),
    "trainjob-without-nnodes": (
        {"PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_NODE_RANK": "0"},
        ("PET_NNODES",),
    ),
    "trainjob-master-only": ({"PET_MASTER_ADDR": "tj-node-0-0.tj"}, ("PET_NODE_RANK",)),
    "node-rank-only": ({"PET_NODE_RANK": "1"}, ("PET_MASTER_ADDR",)),
    "rdzv-backend-only": ({"PET_RDZV_BACKEND": "c10d"}, ("PET_RDZV_ENDPOINT",)),
    "rdzv-id-only": ({"PET_RDZV_ID": "job"}, ("PET_RDZV_ENDPOINT",)),
    "elastic-port-too-big": (
        {"PET_RDZV_ENDPOINT": "job-worker-0:99999", "PET_NNODES": "1:2"},
        ("99999",),
    ),
    "elastic-port-zero": (
        {"PET_RDZV_ENDPOINT": "job-worker-0:0", "PET_NNODES": "1:2"},
        ("port 0",),
    ),
    "elastic-port-unicode": (
        {"PET_RDZV_ENDPOINT": "job-worker-0:²", "PET_NNODES": "1:2"},
        ("host:port",),
    ),
    "elastic-no-host": ({"PET_RDZV_ENDPOINT": ":23456", "PET_NNODES": "1:2"}, ("host:port",)),
    "elastic-nnodes-reversed": (
        {"PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_NNODES": "3:1"},
        ("PET_NNODES",),
    ),
    "master-port-too-big": (
        {"MASTER_ADDR": "m", "MASTER_PORT": "70000", "RANK": "0", "WORLD_SIZE": "2"},
        ("MASTER_PORT=70000",),
    ),
    "master-port-negative": (
        {"MASTER_ADDR": "m", "MASTER_PORT": "-1", "RANK": "0", "WORLD_SIZE": "2"},
        ("MASTER_PORT",),
    ),
    "master-port-word": (
        {"MASTER_ADDR": "m", "MASTER_PORT": "http", "RANK": "0", "WORLD_SIZE": "2"},
        ("MASTER_PORT='http'",),
    ),
    "trainjob-port-too-big": (
        {
            "PET_MASTER_ADDR": "tj",
            "PET_NNODES": "2",
            "PET_NODE_RANK": "0",
            "PET_MASTER_PORT": "65536",
        },
        ("PET_MASTER_PORT=65536",),
    ),  # fmt: skip
    "rank-underscore": (
        {"MASTER_ADDR": "m", "MASTER_PORT": "1", "RANK": "1_0", "WORLD_SIZE": "20"},
        ("RANK='1_0'",),
    ),
    "world-size-huge": (
        {"MASTER_ADDR": "m", "MASTER_PORT": "1", "RANK": "0", "WORLD_SIZE": "9" * 30},
        ("WORLD_SIZE",),
    ),
    "master-without-rank": ({"MASTER_ADDR": "m", "MASTER_PORT": "1"}, ("RANK",)),
    "rank-without-master": ({"RANK": "0", "WORLD_SIZE": "2"}, ("MASTER_ADDR",)),
    "pytorchjob-without-world-size": (
        {"MASTER_ADDR": "m", "PET_NNODES": "2", "PET_NODE_RANK": "0", "RANK": "0"},
        ("WORLD_SIZE",),
    ),
    "nproc-zero": ({"PET_NPROC_PER_NODE": "0"}, ("PET_NPROC_PER_NODE",)),
    "nproc-word": ({"PET_NPROC_PER_NODE": "many"}, ("PET_NPROC_PER_NODE",)),
    "cpu-nproc-word": ({"KUBEDDP_CPU_NPROC": "x"}, ("KUBEDDP_CPU_NPROC",)),
    "indexedjob-without-nnodes": (
        {"JOB_COMPLETION_INDEX": "0", "KUBEDDP_MASTER_ADDR": "ij-0.ij"},
        ("KUBEDDP_NNODES",),
    ),
    "max-restarts-negative": (
        {"PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_NNODES": "1:2", "PET_MAX_RESTARTS": "-1"},
        ("PET_MAX_RESTARTS",),
    ),  # fmt: skip
}


def env_rows() -> list[Row]:
    rows = [
        Row(f"env-{name}", ("launch", "--dry-run"), BAD_INPUT, mentions, env=env)
        for name, (env, mentions) in ENV_ROWS.items()
    ]
    wait_env = {"MASTER_ADDR": "localhost", "MASTER_PORT": "1", "RANK": "1", "WORLD_SIZE": "2"}
    for value in ("nan", "inf", "-1", "ten"):
        env = {**wait_env, "KUBEDDP_RDZV_WAIT_SECONDS": value}
        rows.append(
            Row(f"env-rdzv-wait-{value}", ("launch",), BAD_INPUT, ("KUBEDDP_RDZV_WAIT_SECONDS",),
                env=env)
        )  # fmt: skip
    for value in ("0.1", "nan", "soon"):  # refused before any wait or process, Trainer or not
        env = {**wait_env, "KUBEDDP_TRAINER_STATUS_SECONDS": value}
        rows.append(Row(f"env-trainer-status-seconds-{value}", ("launch",), BAD_INPUT,
                        ("KUBEDDP_TRAINER_STATUS_SECONDS", ">= 1"), env=env))  # fmt: skip
    return rows


# ---- options -----------------------------------------------------------------------------


def option_rows() -> list[Row]:
    rows = []
    for value in ("nan", "inf", "-1", "-inf", "1e9", "soon"):
        rows.append(
            Row(f"rdzv-wait-{value}", ("launch", "--rdzv-wait", value), 2, ("--rdzv-wait",))
        )
    for value in ("-1", "x", "1.5"):
        rows.append(Row(f"max-restarts-{value}", ("train", "--max-restarts", value), 2,
                        ("--max-restarts",)))  # fmt: skip
    for value in ("0", "-1", "x"):
        rows.append(Row(f"nproc-{value}", ("train", "--dry-run", "--nproc", value), 2, ("nproc",)))
    for value in ("nan", "inf", "-1"):
        rows.append(Row(f"wait-timeout-{value}", ("wait", "demo", "--timeout", value), 2,
                        ("--timeout",), api="ok", api_untouched=True))  # fmt: skip
    for value in ("0", "nan", "-2"):
        rows.append(Row(f"wait-interval-{value}", ("wait", "demo", "--interval", value), 2,
                        ("--interval",), api="ok", api_untouched=True))  # fmt: skip
    rows.append(Row("logs-tail-negative", ("logs", "demo", "--tail", "-1"), 2, ("--tail",),
                    api="ok", api_untouched=True))  # fmt: skip
    for value in ("0", "nan", "0.5s", "30x"):  # durations of 1 s or more are taken
        rows.append(Row(f"request-timeout-{value}", ("status", "demo", "--request-timeout", value),
                        2, ("--request-timeout",), api="ok", api_untouched=True))  # fmt: skip
    rows.append(Row("worker-flag-after-dash", ("launch", "--", "--sett", "x"), 2, ("--sett",)))
    # a fabric the namespace's declared Pod Security level refuses, or one without its devices
    rows.append(Row("fabric-above-pod-security", (*RENDER, "--fabric", "roce", "--fabric-resource",
                    "rdma/ib", "--pod-security", "baseline"), BAD_INPUT,
                    ("--fabric", "privileged", "baseline", "IPC_LOCK")))  # fmt: skip
    rows.append(Row("fabric-without-resource", (*RENDER, "--fabric", "infiniband"), BAD_INPUT,
                    ("--fabric", "network.deviceResource", "rdma/ib")))  # fmt: skip
    rows.append(Row("unknown-command-option", ("status",), 2, ("NAME",)))
    # the fabric's device resource may not be the GPU resource: 8 GPUs rendered as 1
    rows.append(Row("fabric-resource-is-the-gpu", (*RENDER, "--fabric", "infiniband",
                    "--fabric-resource", "nvidia.com/gpu", "--gpus-per-node", "8"), BAD_INPUT,
                    ("--fabric-resource", "nvidia.com/gpu", "GPU resource")))  # fmt: skip
    # an object-store URL that climbs out of its bucket or prefix, wherever it is given
    for url in ("s3://b/../x", "s3://bucket/run/../../other", "s3://bucket//x", "s3://bucket/./x"):
        for key in ("dir", "resume"):
            rows.append(
                Row(
                    f"render-checkpoint-{key}-{url}",
                    (*RENDER, "--set", f"checkpoint.{key}={url}"),
                    BAD_INPUT,
                    (f"checkpoint.{key}", url),
                )
            )
        rows.append(
            Row(
                f"launch-dry-run-checkpoint-dir-{url}",
                ("launch", "--dry-run", "--", "--set", f"checkpoint.dir={url}"),
                BAD_INPUT,
                ("checkpoint.dir",),
            )
        )
    # a dry run refuses what the real start refuses: unknown keys, wrong values
    for setting in ("train.nope=1", "nope.x=1", "train.lr=fast"):
        rows.append(Row(f"launch-dry-run-config-{setting}", ("launch", "--dry-run", "--",
                        "--set", setting), BAD_INPUT, (setting.split(".")[0],)))  # fmt: skip
        rows.append(Row(f"train-dry-run-config-{setting}", ("train", "--dry-run", "--set",
                        setting), BAD_INPUT, (setting.split(".")[0],)))  # fmt: skip
    return rows


# ---- names that must never reach the API server ------------------------------------------

BAD_NAMES = {
    "traversal": "../../../../api/v1/namespaces/kube-system/secrets/db-password",
    "query": "x?dryRun=All",
    "fragment": "x#y",
    "encoded-dots": "%2e%2e",
    "slash": "a/b",
    "upper": "Demo",
    "empty": "",
    "space": "a b",
    "long": "a" * 254,
    "unicode": "dеmo",  # a Cyrillic e
    "newline": "demo\n",
}


def name_rows() -> list[Row]:
    rows = []
    for label, name in BAD_NAMES.items():
        for command in ("status", "delete", "logs", "wait"):
            rows.append(Row(f"{command}-name-{label}", (command, name), 2, ("name",), api="ok",
                            api_untouched=True))  # fmt: skip
    for label, namespace in (("slash", "a/b"), ("query", "ns?x=1"), ("upper", "Team")):
        rows.append(Row(f"namespace-{label}", ("delete", "demo", "-n", namespace), 2,
                        ("namespace",), api="ok", api_untouched=True))  # fmt: skip
    return rows


# ---- manifests of the wrong shape --------------------------------------------------------

CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}
PYTORCHJOB_KEY = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}
MANIFEST_PROBLEMS: dict[str, object] = {
    "metadata-list": {**CONFIG_MAP, "metadata": ["c"]},
    "metadata-string": {**CONFIG_MAP, "metadata": "c"},
    "data-list": {**CONFIG_MAP, "data": [1]},
    "kind-number": {**CONFIG_MAP, "kind": 7},
    "api-version-list": {**CONFIG_MAP, "apiVersion": ["v1"]},
    "no-kind": {"apiVersion": "v1", "metadata": {"name": "c"}},
    "list-items-number": {"apiVersion": "v1", "kind": "List", "items": 7},
    "list-items-string": {"apiVersion": "v1", "kind": "List", "items": "abc"},
    "list-item-scalar": {"apiVersion": "v1", "kind": "List", "items": [1, CONFIG_MAP]},
    "pytorchjob-spec-list": {**PYTORCHJOB_KEY, "metadata": {"name": "p"}, "spec": [1]},
    "pytorchjob-spec-string": {**PYTORCHJOB_KEY, "metadata": {"name": "p"}, "spec": "x"},
    "pytorchjob-replicas-list": {
        **PYTORCHJOB_KEY,
        "metadata": {"name": "p"},
        "spec": {"pytorchReplicaSpecs": [1]},
    },  # fmt: skip
    "pytorchjob-containers-number": {
        **PYTORCHJOB_KEY,
        "metadata": {"name": "p"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": {"spec": {"containers": 7}}}
            }
        },
    },  # fmt: skip
    "trainjob-patches-number": {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "r"}, "runtimePatches": 7},
    },  # fmt: skip
    "job-containers-string": {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"template": {"spec": {"containers": "x"}}},
    },  # fmt: skip
    "unknown-kind": {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
}
NOT_OBJECTS: dict[str, bytes] = {
    "scalar-document": b"42\n",
    "list-document": b"- 1\n- 2\n",
    "string-document": b"just text\n",
}


def manifest_rows() -> list[Row]:
    rows = [
        Row(f"validate-{name}", ("validate", "{tmp}/m.yaml", "--validate-against", "offline"),
            PROBLEMS_FOUND, ("problem",), {"m.yaml": _text(json.dumps(doc))})
        for name, doc in MANIFEST_PROBLEMS.items()
    ]  # fmt: skip
    rows += [
        Row(f"validate-{name}", ("validate", "{tmp}/m.yaml"), BAD_INPUT, ("not a Kubernetes",),
            {"m.yaml": content})
        for name, content in NOT_OBJECTS.items()
    ]  # fmt: skip
    rows.append(
        Row("submit-file-unknown-kind",
            ("submit", "-f", "{tmp}/m.yaml", "--validate-against", "offline"), BAD_INPUT, (),
            {"m.yaml": _text(yaml.safe_dump(MANIFEST_PROBLEMS["unknown-kind"]))}, api="ok",
            api_untouched=True)
    )  # fmt: skip
    return rows


# ---- kubeconfigs -------------------------------------------------------------------------

_GOOD = fake_api.kubeconfig_for("http://127.0.0.1:1")
KUBECONFIGS: dict[str, object] = {
    "a-list": [1, 2],
    "a-string": "hello",
    "no-contexts": {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": []},
    "contexts-string": {**_GOOD, "contexts": "test"},
    "clusters-number": {**_GOOD, "clusters": 7},
    "context-missing-cluster": {**_GOOD, "clusters": []},
    "current-context-unknown": {**_GOOD, "current-context": "nope"},
    "server-not-a-url": {**_GOOD, "clusters": [{"name": "c", "cluster": {"server": "://x"}}]},
    "cluster-entry-string": {**_GOOD, "clusters": ["c"]},
    "user-token-list": {**_GOOD, "users": [{"name": "u", "user": {"token": [1]}}]},
    "ca-file-missing": {
        **_GOOD,
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": "https://127.0.0.1:1",
                    "certificate-authority": "/nonexistent/ca.crt",
                },
            }
        ],
    },  # fmt: skip
    "ca-data-not-base64": {
        **_GOOD,
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": "https://127.0.0.1:1", "certificate-authority-data": "%%%"},
            }
        ],
    },  # fmt: skip
}


def kubeconfig_rows() -> list[Row]:
    rows = [
        Row(f"kubeconfig-{name}", ("status", "demo", "--kubeconfig", "{tmp}/kc.yaml"),
            CLUSTER_ERROR, (), {"kc.yaml": _text(yaml.safe_dump(doc))})
        for name, doc in KUBECONFIGS.items()
    ]  # fmt: skip
    rows.append(Row("kubeconfig-missing", ("status", "demo", "--kubeconfig", "{tmp}/nope"),
                    CLUSTER_ERROR, ("no kubeconfig",)))  # fmt: skip
    rows.append(Row("context-unknown", ("status", "demo", "--kubeconfig", "{tmp}/kc.yaml",
                                        "--context", "nope"), CLUSTER_ERROR, ("nope",),
                    {"kc.yaml": _text(yaml.safe_dump(_GOOD))}))  # fmt: skip
    rows.append(Row("server-refuses", ("status", "demo", "--kubeconfig", "{tmp}/kc.yaml"),
                    CLUSTER_ERROR, ("cannot reach",),
                    {"kc.yaml": _text(yaml.safe_dump(_GOOD))}))  # fmt: skip
    return rows


# ---- API answers -------------------------------------------------------------------------

API_COMMANDS: dict[str, tuple[str, ...]] = {
    "status": ("status", "demo"),
    "delete": ("delete", "demo"),
    "wait": ("wait", "demo", "--timeout", "5", "--interval", "0.1"),
    "logs": ("logs", "demo"),
    "submit": ("submit", "-f", "{tmp}/cm.yaml", "--validate-against", "offline"),
    "validate": ("validate", "{tmp}/job.yaml", "--validate-against", "cluster"),
}
# Every cluster command sends its requests through one transport (Cluster.request in
# tools/cluster/kube.py): each misbehaviour of the connection or the answer's bytes meets it once,
# the command taken in turn. What the answer must be (its kind and name) each command says for
# itself: a JSON object of the wrong kind, and an empty one, meet every command (a check of
# `{}` dropped from one command's reads was caught by no other row).
TRANSPORT_ROWS = {  # misbehaviour: the command that meets it
    "hang": "status",
    "hang-body": "validate",
    "html": "delete",
    "500": "submit",
    "502": "logs",
    "reset": "status",
    "close": "wait",
    "json-list": "logs",
    "json-bad": "validate",
    "truncated": "wait",
    "garbage": "delete",
    "deep": "status",
    "drip": "status",
}
ANSWER_MISBEHAVIOURS = ("wrong-kind", "empty-object")
# What the line must say where the exit code alone would not show the fault: an answer that
# drips in within each read's timeout is cut off at the request's, not waited for.
API_MENTIONS = {"drip": ("not the whole answer in that time",)}


def api_rows() -> list[Row]:
    job = {**PYTORCHJOB_KEY, "metadata": {"name": "p"}}  # validation asks for its CRD first
    files = {"cm.yaml": _text(yaml.safe_dump(CONFIG_MAP)), "job.yaml": _text(yaml.safe_dump(job))}
    pairs = [
        *TRANSPORT_ROWS.items(),
        *((mode, command) for mode in ANSWER_MISBEHAVIOURS for command in API_COMMANDS),
    ]
    return [
        Row(
            f"api-{mode}-{command}",
            API_COMMANDS[command],
            CLUSTER_ERROR,
            API_MENTIONS.get(mode, ()),
            files,
            api=mode,
        )
        for mode, command in pairs
    ]


def all_rows() -> list[Row]:
    rows = [
        *config_rows(),
        *file_rows(),
        *env_rows(),
        *option_rows(),
        *name_rows(),
        *manifest_rows(),
        *kubeconfig_rows(),
        *api_rows(),
    ]
    from tests.helpers.hostile_inputs import hostile_rows  # it imports Row from here

    rows += hostile_rows()
    ids = [row.id for row in rows]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    return rows
