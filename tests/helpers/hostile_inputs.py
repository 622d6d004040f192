"""Rows of the bad-input table (tests/helpers/bad_inputs.py) for issue 24's classes: user code
that must never run in the launcher, addresses, ports and counts checked before any wait, an
unwritable stdout, the program's own exit status, kubeddp's reserved env names and the names
the API server refuses, config files that are not files, and user programs whose bad calls
must not end them. The API's misbehaviours (`{}` to everything, a Pod for a PyTorchJob, an
answer nested 100,000 deep, a dripping server) are rows of tests/helpers/bad_inputs.api_rows:
each of tests/helpers/fake_api.MISBEHAVIOURS against one cluster command, and a Pod for
whatever was asked against each.
"""

from __future__ import annotations

from kubeddp.trainer.exit_codes import BAD_INPUT, OK, TRAINING_FAILED
from tests.helpers.bad_inputs import RENDER, Row

# A user's module that says so if the launcher ever runs it (it must not).
RAN = b"""import pathlib
pathlib.Path(__file__).with_name('RAN').write_text('ran')
raise SystemExit(3)
"""
USER_CODE = {"train.py": RAN, "pkg/__init__.py": RAN, "pkg/train.py": RAN}


def user_code_rows() -> list[Row]:
    rows = []
    for dry in ((), ("--dry-run",)):
        label = "-dry-run" if dry else ""
        rows += [
            Row(f"module-file-typo{label}", ("train", *dry, "--module", "train.py"), BAD_INPUT,
                ("--script train.py",), USER_CODE, in_tmp=True, must_not_exist=("RAN",)),
            Row(f"module-package-without-main{label}", ("train", *dry, "--module", "pkg"),
                BAD_INPUT, ("__main__",), USER_CODE, in_tmp=True, must_not_exist=("pkg/RAN",)),
            Row(f"module-below-a-module{label}", ("train", *dry, "--module", "train.sub"),
                BAD_INPUT, ("not a package",), USER_CODE, in_tmp=True, must_not_exist=("RAN",)),
            Row(f"module-not-a-name{label}", ("train", *dry, "--module", "my-train"), BAD_INPUT,
                ("not a module name",), USER_CODE, in_tmp=True),
        ]  # fmt: skip
    # A package's own __init__ is imported by `python -m pkg.train` in the workers, never here.
    rows.append(
        Row(
            "module-in-package-dry-run",
            ("train", "--dry-run", "--module", "pkg.nope"),
            BAD_INPUT,
            ("pkg.nope",),
            USER_CODE,
            in_tmp=True,
            must_not_exist=("pkg/RAN",),
        )
    )
    return rows  # fmt: skip


# ---- addresses, ports and counts: exit 2 at once, not a wait then 200 ----------------------

WAIT = ("--rdzv-wait", "5")  # accepted by mistake, the row would end 200 in 5 s, not hang
STATIC = ("launch", "--nnodes", "2", "--node-rank", "1", *WAIT)
NODE_FLAG_ROWS = {
    "master-addr-with-port": ((*STATIC, "--master-addr", "127.0.0.1:1234"), "--master-port"),
    "master-addr-empty": ((*STATIC, "--master-addr", ""), "empty"),
    "master-addr-space": ((*STATIC, "--master-addr", "a b"), "'a b'"),
    "master-addr-slash": ((*STATIC, "--master-addr", "http://h"), "http://h"),
    "master-addr-too-long": ((*STATIC, "--master-addr", "a" * 300), "253"),
    "master-port-zero": ((*STATIC, "--master-addr", "h", "--master-port", "0"), "--master-port 0"),
    "rdzv-endpoint-no-port": (("launch", "--nnodes", "1:2", "--rdzv-endpoint", "::1", *WAIT),
                              "HOST:PORT"),
    "rdzv-endpoint-port-zero": (("launch", "--nnodes", "1:2", "--rdzv-endpoint", "h:0", *WAIT),
                                "port 0"),
    "nproc-huge": (("launch", "--nproc-per-node", "100000", *WAIT), "100000"),
    "nnodes-huge": (("launch", "--nnodes", "9" * 20, "--node-rank", "0", "--master-addr", "h",
                     *WAIT), "nnodes"),
    "nnodes-huge-range": (("launch", "--nnodes", "1:" + "9" * 20, "--rdzv-endpoint", "h:1",
                           *WAIT), "nnodes"),
    "nnodes-underscore": ((*STATIC[:2], "1_0", *STATIC[3:], "--master-addr", "h"), "--nnodes"),
    "rdzv-id-space": (("launch", "--nnodes", "1:2", "--rdzv-endpoint", "h:1", "--rdzv-id", "a b",
                       *WAIT), "rendezvous id"),
}  # fmt: skip
ELASTIC = {"PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_NNODES": "1:2"}
PLAIN = {"MASTER_PORT": "1", "RANK": "1", "WORLD_SIZE": "2"}
ENV_ROWS: dict[str, tuple[dict[str, str], str]] = {
    "rdzv-conf-malformed": ({**ELASTIC, "PET_RDZV_CONF": "garbage"}, "PET_RDZV_CONF"),
    "rdzv-conf-empty-key": ({**ELASTIC, "PET_RDZV_CONF": "=1"}, "PET_RDZV_CONF"),
    "rdzv-conf-timeout-word": ({**ELASTIC, "PET_RDZV_CONF": "join_timeout=soon"}, "join_timeout"),
    "rdzv-backend-unknown": ({**ELASTIC, "PET_RDZV_BACKEND": "zookeeper"}, "PET_RDZV_BACKEND"),
    "master-addr-with-port": ({**PLAIN, "MASTER_ADDR": "m:1234"}, "'m:1234'"),
    "master-addr-space": ({**PLAIN, "MASTER_ADDR": "a b"}, "'a b'"),
    "trainjob-master-addr-space": (
        {"PET_MASTER_ADDR": "a b", "PET_NNODES": "2", "PET_NODE_RANK": "1"}, "'a b'"),
    "indexedjob-nnodes-huge": (
        {"JOB_COMPLETION_INDEX": "0", "KUBEDDP_MASTER_ADDR": "ij-0.ij",
         "KUBEDDP_NNODES": "99999999"}, "nnodes"),
    "nproc-huge": ({"PET_NPROC_PER_NODE": "100000"}, "100000"),
}  # fmt: skip


def address_rows() -> list[Row]:
    rows = [Row(f"flag-{name}", argv, BAD_INPUT, (word,))
            for name, (argv, word) in NODE_FLAG_ROWS.items()]  # fmt: skip
    rows += [Row(f"launch-env-{name}", ("launch", *WAIT), BAD_INPUT, (word,), env=env)
             for name, (env, word) in ENV_ROWS.items()]  # fmt: skip
    return rows


# ---- standard output that cannot be written: one line, exit 1 -------------------------------

CM = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata: {}\n"


def output_rows() -> list[Row]:
    rows = []
    for mode in ("full", "closed", "broken-pipe"):
        rows += [
            Row(f"render-stdout-{mode}", RENDER, TRAINING_FAILED, ("standard output",),
                stdout=mode, notes=("kubeddp render: Checkpoints:",)),
            Row(f"submit-client-stdout-{mode}",
                ("submit", "-f", "{tmp}/cm.yaml", "--dry-run", "client", "--validate-against",
                 "offline"), TRAINING_FAILED, ("standard output",), {"cm.yaml": CM}, stdout=mode),
            Row(f"train-dry-run-stdout-{mode}", ("train", "--dry-run"), TRAINING_FAILED,
                ("standard output",), stdout=mode),
            Row(f"validate-problems-stdout-{mode}", ("validate", "{tmp}/cm.yaml"),
                TRAINING_FAILED, ("standard output",), {"cm.yaml": CM.replace(b"{}", b"[1]")},
                stdout=mode),
        ]  # fmt: skip
    return rows


# ---- kubeddp's own env names, and names the API server refuses ------------------------------

RESERVED = ("KUBEDDP_NNODES", "KUBEDDP_MASTER_ADDR", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES",
            "PET_RDZV_ENDPOINT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK",
            "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "PATH")  # fmt: skip
LONG = "a" * 300


def name_rows() -> list[Row]:
    rows = []
    for name in RESERVED:
        rows += [
            Row(f"env-reserved-{name}", (*RENDER, "--env", f"{name}=9"), BAD_INPUT, (name,)),
            Row(f"env-secret-reserved-{name}", (*RENDER, "--env-secret", f"{name}=s:k"),
                BAD_INPUT, (name,)),
            Row(f"extra-env-reserved-{name}",
                (*RENDER, "--extra-env", f'[{{"name": "{name}", "value": "9"}}]'), BAD_INPUT,
                (name,)),
        ]  # fmt: skip
    bad = {
        "env-secret-digit-name": (("--env-secret", "1BAD=s:k"), "'1BAD'"),
        "env-secret-twice": (("--env-secret", "A=s:k", "--env-secret", "A=t:k"), "A twice"),
        "env-and-env-secret": (("--env", "A=1", "--env-secret", "A=t:k"), "also set in env"),
        "extra-env-twice": (("--extra-env", '[{"name": "A"}, {"name": "A"}]'), "A twice"),
        "env-secret-secret-name": (("--env-secret", "A=Bad_Name:k"), "'Bad_Name'"),
        "env-secret-key": (("--env-secret", "A=s:bad key!"), "'bad key!'"),
        "env-secret-long-name": (("--env-secret", f"A={LONG}:k"), "253"),
        "volume-claim-upper": (("--volume", "claim:Data:/data"), "'Data'"),
        "volume-claim-long": (("--volume", f"claim:{LONG}:/data"), "253"),
        "volume-secret-name": (("--volume", "secret:Bad_Name:/s"), "'Bad_Name'"),
        "volume-configmap-name": (("--volume", "configmap:a b:/s"), "'a b'"),
        "volume-long-mount-path": (("--volume", "claim:d:/" + "a" * 5000), "4095"),
        "checkpoint-claim-upper": (("--checkpoint-pvc", "Data"), "'Data'"),
        "nodes-above-int32": (("--nodes", str(2**31)), "2147483647"),
        "node-selector-key": (("--node-selector", "a b=c"), "'a b'"),
        "node-selector-value-long": (("--node-selector", "k=" + "v" * 64), "63"),
        "backoff-above-int32": (("--backoff-limit", str(2**31)), "2147483647"),
        "time-limit-days": (("--time-limit", "2d"), "a duration such as 90m"),
        "time-limit-zero": (("--time-limit", "0s"), "under one second"),
    }
    rows += [Row(f"render-{label}", (*RENDER, *argv), BAD_INPUT, (word,))
             for label, (argv, word) in bad.items()]  # fmt: skip
    return rows


# ---- files that are not files, config keys a program ignores, nothing to submit ------------


def file_rows() -> list[Row]:
    fifo = "{tmp}/fifo.yaml"
    script = {"s.py": b"print('the program')\n"}
    return [
        Row("train-config-fifo", ("train", "--config", fifo), BAD_INPUT, ("not a regular file",),
            fifos=("fifo.yaml",)),
        Row("render-config-fifo", (*RENDER, "--config", fifo), BAD_INPUT,
            ("not a regular file",), fifos=("fifo.yaml",)),
        Row("validate-fifo", ("validate", fifo), BAD_INPUT, ("not a regular file",),
            fifos=("fifo.yaml",)),
        Row("train-config-device", ("train", "--config", "/dev/zero"), BAD_INPUT,
            ("not a regular file",)),
        Row("script-config-trainer-key",
            ("train", "--config", "{tmp}/c.yaml", "--script", "{tmp}/s.py"), BAD_INPUT,
            ("train.lr", "--script"), {**script, "c.yaml": b"train:\n  lr: 0.1\n"}),
        Row("module-config-trainer-section",
            ("train", "--dry-run", "--config", "{tmp}/c.yaml", "--module", "pkg.train"),
            BAD_INPUT, ("workload", "--module"),
            {**USER_CODE, "c.yaml": b"workload: regression\n"}, in_tmp=True,
            must_not_exist=("pkg/RAN",)),
        Row("submit-file-empty", ("submit", "-f", "{tmp}/e.yaml", "--validate-against", "offline"),
            BAD_INPUT, ("no Kubernetes objects",), {"e.yaml": b""}, api="ok",
            api_untouched=True),
        Row("submit-file-comments-only",
            ("submit", "-f", "{tmp}/e.yaml", "--validate-against", "offline"), BAD_INPUT,
            ("no Kubernetes objects",), {"e.yaml": b"---\n# nothing\n---\n"}, api="ok",
            api_untouched=True),
    ]  # fmt: skip


# ---- user programs: their own exit status, an early return, bad calls to kubeddp.api -------
# Real training runs (torchrun, 2 gloo workers): tests/integration/test_bad_input.py only.

EARLY_RETURN = b"""
import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise SystemExit(0)  # returns while rank 0 still has a collective to run
time.sleep(1)
dist.all_reduce(torch.zeros(1))
"""
BAD_REPORTS = b"""
from kubeddp import api
api.report_step(-5, -3)
api.report_step("x", 1.5, loss="high", tokens=-1)
api.report_step(1, 4, loss=0.5)
print("the program went on")
"""
HALF_WRITTEN = b"""
import os
from kubeddp import api
rank = os.environ["RANK"]
# another process's multiprocess file, created and not yet written (a worker starting)
open(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"counter_9999{rank}.db"), "wb").close()
api.report_step(1, 4, loss=0.5)
api.report_step(2, 4, loss=0.4)
print("the program went on")
"""
TRAIN = ("train", "--nproc", "2", "--set", "metrics.port=0", "--script")


def program_rows() -> list[Row]:
    return [
        Row("program-exit-minus-1", (*TRAIN, "{tmp}/p.py"), TRAINING_FAILED, ("sys.exit(-1)",),
            {"p.py": b"import sys\nsys.exit(-1)\n"}, training=True),
        Row("program-exit-256", (*TRAIN, "{tmp}/p.py"), TRAINING_FAILED, ("sys.exit(256)",),
            {"p.py": b"import sys\nsys.exit(256)\n"}, training=True),
        Row("program-rank-returns-early", (*TRAIN, "{tmp}/p.py"), TRAINING_FAILED,
            ("rank 1", "returned"), {"p.py": EARLY_RETURN}, training=True),
        Row("program-report-step-bad-arguments", (*TRAIN, "{tmp}/p.py"), OK,
            ("report_step ignored",), {"p.py": BAD_REPORTS}, training=True),
        Row("program-metrics-half-written-file", (*TRAIN, "{tmp}/p.py"), OK, (),
            {"p.py": HALF_WRITTEN}, training=True),
        Row("program-module-file-typo", ("train", "--nproc", "2", "--module", "train.py"),
            BAD_INPUT, ("--script train.py",), USER_CODE, in_tmp=True, must_not_exist=("RAN",)),
    ]  # fmt: skip


def hostile_rows() -> list[Row]:
    return [
        *user_code_rows(),
        *address_rows(),
        *output_rows(),
        *name_rows(),
        *file_rows(),
        *program_rows(),
    ]
