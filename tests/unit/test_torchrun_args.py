"""Launch's torchrun command line against the installed torch's own parser, for every shape a
rendezvous plan takes (standalone, static, c10d elastic).

torch versions differ in which options their parser has (tests/torch-compat notes: 23 to 32
options between 2.4 and 2.14), so neither launch nor this test reads an attribute of the
parsed namespace: what it holds is looked up in vars(). torch's own config_from_args, which
torchrun's run() calls next, must then accept the namespace as this torch builds it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from torch.distributed.run import config_from_args

from kubeddp.trainer.launcher import torchrun_cli
from kubeddp.trainer.launcher.agent import WORKER_MODULE, torchrun_args
from kubeddp.trainer.launcher.rendezvous import plan_from_env

pytestmark = pytest.mark.timeout(60)

WORKER_ARGS = ["--config", "/etc/kubeddp/config.yaml", "--set", "train.max_steps=1"]
POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
STATIC = {  # PyTorchJob v1, Master + 1 Worker, this pod the worker
    **POD,
    "MASTER_ADDR": "demo-master-0",
    "PET_MASTER_ADDR": "demo-master-0",
    "MASTER_PORT": "23456",
    "PET_MASTER_PORT": "23456",
    "WORLD_SIZE": "4",
    "RANK": "1",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "2",
    "PET_NNODES": "2",
}
ELASTIC = {  # elastic PyTorchJob v1, Workers only, min 1 max 3
    **POD,
    "PET_NPROC_PER_NODE": "2",
    "PET_NNODES": "1:3",
    "PET_RDZV_ENDPOINT": "demo-worker-0:23456",
    "PET_RDZV_BACKEND": "c10d",
    "PET_RDZV_ID": "run-7",
    "PET_MAX_RESTARTS": "3",
    "PET_RDZV_CONF": "join_timeout=900",
}

# plan shape -> (env, what the parsed namespace must hold)
SHAPES: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "standalone": ({}, {"standalone": True, "local_addr": "127.0.0.1", "nnodes": "1:1"}),
    "static": (
        STATIC,
        {
            "standalone": False,
            "nnodes": "2",
            "node_rank": 1,
            "master_addr": "demo-master-0",
            "master_port": 23456,
            "rdzv_backend": "static",
        },
    ),
    "c10d elastic": (
        ELASTIC,
        {
            "standalone": False,
            "nnodes": "1:3",
            "rdzv_backend": "c10d",
            "rdzv_endpoint": "demo-worker-0:23456",
            "rdzv_id": "run-7",
            "rdzv_conf": "join_timeout=900",
            "max_restarts": 3,
        },
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_installed_parser_takes_every_plan_shape(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, expected = SHAPES[shape]
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)  # torchrun's parser reads PET_* defaults from this process
    plan = plan_from_env(env, WORKER_ARGS, nproc_flag="2", gpu_count=lambda: 0)
    parsed = vars(torchrun_args(plan))
    held = {key: parsed.get(key) for key in expected}
    assert held == expected, plan.argv
    assert parsed.get("nproc_per_node") == "2"
    assert parsed.get("module") is True
    assert parsed.get("training_script") == WORKER_MODULE
    assert parsed.get("training_script_args") == WORKER_ARGS
    config, command, command_args = config_from_args(torchrun_args(plan))
    assert vars(config).get("nproc_per_node") == 2
    assert command_args[-len(WORKER_ARGS) :] == WORKER_ARGS
    assert WORKER_MODULE in command_args


def _sample(action) -> str | None:
    """A value torchrun takes for `action` (None: a flag without a value)."""
    if action.nargs == 0:
        return None
    if action.choices:
        return str(list(action.choices)[-1])
    samples = {"tee": "3", "redirects": "1", "local_ranks_filter": "0,1",
               "rdzv_conf": "join_timeout=5", "signals_to_handle": "SIGTERM,SIGINT"}  # fmt: skip
    if action.dest in samples:
        return samples[action.dest]
    return {int: "7", float: "0.5"}.get(action.type, "a,b")


def test_kubeddp_train_takes_every_torchrun_option() -> None:
    from torch.distributed.run import get_args_parser

    from kubeddp.trainer.launcher.launch import train_parser

    theirs = {o for a in get_args_parser()._actions for o in a.option_strings}
    ours = {o for a in train_parser()._actions for o in a.option_strings}
    assert theirs - ours == set()


@pytest.mark.parametrize("dest", [a.dest for a in torchrun_cli.torchrun_actions()])
def test_each_passed_on_option_means_what_it_means_to_torchrun(
    dest: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubeddp train OPTION VALUE t.py: torchrun's parser gets the value torchrun itself would
    parse from the same words (or kubeddp does it: --no-python, --run-path)."""
    from torch.distributed.run import get_args_parser

    from kubeddp.trainer.launcher.launch import train_parser

    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    action = next(a for a in torchrun_cli.torchrun_actions() if a.dest == dest)
    value = _sample(action)
    words = [action.option_strings[0]] + ([] if value is None else [value])
    args = train_parser().parse_args(words)
    flags = torchrun_cli.passed_on(args, torchrun_cli.torchrun_actions())
    if dest in torchrun_cli.DONE_HERE:
        assert flags == [] and torchrun_cli.torchrun_option(args, dest)
        return
    plan = plan_from_env({}, WORKER_ARGS, nproc_flag="1", torchrun_flags=flags)
    ours = vars(torchrun_args(plan))[dest]
    torchrun_itself = vars(get_args_parser().parse_args([*words, "train.py"]))[dest]
    assert ours == torchrun_itself
    assert ours not in (None, False, action.default)


@pytest.mark.parametrize(
    "program_args",
    [["--log", "5"], ["--nproc", "4", "--tee", "1"], ["--standalone", "-m", "x"], ["--", "--x"]],
    ids=str,
)
def test_program_arguments_never_meet_torchruns_parser(program_args: list[str]) -> None:
    plan = plan_from_env({}, program_args, nproc_flag="1", torchrun_flags=["--tee=3"])
    parsed = vars(torchrun_args(plan))
    assert parsed["training_script_args"] == program_args
    assert parsed["tee"] == "3"


SPLIT = {
    # kubeddp train argv -> (own options, program, program arguments)
    "torchrun form": (["--nproc_per_node=2", "t.py", "--log", "5"],
                      (["--nproc_per_node=2"], ["--script", "t.py"], ["--log", "5"])),
    "-- after the program": (["t.py", "--", "--x"], ([], ["--script", "t.py"], ["--x"])),
    "bare --module flag": (["--module", "--tee", "3", "pkg.train", "1"],
                           (["--tee", "3"], ["--module", "pkg.train"], ["1"])),
    "-m NAME": (["--role", "r", "-m", "pkg.train", "1"],
                (["--role", "r"], ["--module", "pkg.train"], ["1"])),
    "value flags skipped": (["-r", "3", "--log-dir", "d", "--no-python", "run.sh"],
                            (["-r", "3", "--log-dir", "d", "--no-python"],
                             ["--script", "run.sh"], [])),
}  # fmt: skip


@pytest.mark.parametrize("case", SPLIT)
def test_split_program(case: str) -> None:
    from kubeddp.trainer.launcher.launch import train_parser

    argv, (own, program, after) = SPLIT[case]
    found = torchrun_cli.split_program(train_parser(), argv)
    assert found is not None
    assert (found[0], found[1], torchrun_cli.program_arguments(found[2])) == (own, program, after)
