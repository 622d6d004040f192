"""Launch's torchrun command line against the installed torch's own parser: for every shape a
rendezvous plan takes (standalone, static, c10d elastic), for kubeddp's table of torchrun's
flags (torchrun_flags.py), and for the command lines users paste: kubeddp and torchrun must
agree on the program, what it receives and every setting the line gives.

torch versions differ in which options their parser has (tests/torch-compat notes: 23 to 32
options between 2.4 and 2.14), so neither launch nor this test reads an attribute of the
parsed namespace: what it holds is looked up in vars(). torch's own config_from_args, which
torchrun's run() calls next, must then accept the namespace as this torch builds it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.run import config_from_args, get_args_parser

from kubeddp.trainer.common import installed_torch_version
from kubeddp.trainer.launcher import torchrun_cli
from kubeddp.trainer.launcher.agent import WORKER_MODULE, torchrun_args
from kubeddp.trainer.launcher.launch import launch_parser, parse_command_line, train_parser
from kubeddp.trainer.launcher.launch_plan import plan_launch
from kubeddp.trainer.launcher.rendezvous import plan_from_env
from kubeddp.trainer.launcher.torch_check import release
from kubeddp.trainer.launcher.torchrun_flags import (
    BY_DEST,
    DECIDED,
    DONE_HERE,
    NOT_TAKEN,
    PASSED_ON,
    TorchrunFlag,
)

REPO = Path(__file__).resolve().parents[2]

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


def _sample(flag: TorchrunFlag) -> str | None:
    """A value torchrun takes for `flag` (None: a flag without a value)."""
    if not flag.takes_value:
        return None
    if flag.choices:
        return flag.choices[-1]
    samples = {"tee": "3", "redirects": "1", "local_ranks_filter": "0,1",
               "rdzv_conf": "join_timeout=5", "signals_to_handle": "SIGTERM,SIGINT"}  # fmt: skip
    if flag.dest in samples:
        return samples[flag.dest]
    return {int: "7", float: "0.5"}.get(flag.kind, "a,b")


def _no_pet(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)  # torchrun's parser reads PET_* defaults from this process


INSTALLED = release(installed_torch_version())
HERE = [flag for flag in PASSED_ON if INSTALLED is None or flag.since <= INSTALLED[:2]]


def test_the_flag_table_is_the_installed_torchruns() -> None:
    """torchrun_flags.py, written once so --help needs no torch, against the installed torch's
    real parser: every option it has is passed on (a row of the table), decided by kubeddp or
    not taken; every row this torch should have, it has, with the same value, choices and type.
    The range job runs this on the oldest and the newest torch kubeddp supports."""
    theirs = {a.dest: a for a in get_args_parser()._actions if a.option_strings}
    assert set(theirs) == {f.dest for f in HERE} | (DECIDED & set(theirs)) | (
        NOT_TAKEN & set(theirs)
    ), "a torchrun option is missing from torchrun_flags.py (or a row's `since` is wrong)"
    assert set(theirs) >= DECIDED
    for flag in HERE:
        action = theirs[flag.dest]
        assert set(action.option_strings) == set(flag.options), flag.dest
        assert (action.nargs != 0) == flag.takes_value, flag.dest
        assert tuple(action.choices or ()) == (flag.choices or ()), flag.dest
        if flag.takes_value:
            assert (action.type if action.type in (int, float) else str) == flag.kind, flag.dest


def test_train_and_launch_take_every_torchrun_option_and_no_other_name() -> None:
    theirs = {o for a in get_args_parser()._actions for o in a.option_strings}
    not_taken = {o for a in get_args_parser()._actions if a.dest in NOT_TAKEN
                 for o in a.option_strings}  # fmt: skip
    for parser in (train_parser(), launch_parser()):
        ours = {o for a in parser._actions for o in a.option_strings}
        assert theirs - not_taken - ours == set(), parser.prog
    assert sorted(a.option_strings for a in train_parser()._actions) == sorted(
        a.option_strings for a in launch_parser()._actions
    ), "train and launch take the same options under the same names"


def test_help_imports_no_torch() -> None:
    """`kubeddp train --help` (and launch's): the torchrun flags come from kubeddp's table."""
    code = (
        "import sys\nfrom kubeddp.tools.cli.main import main\n"
        "for command in ('train', 'launch'):\n"
        "    try:\n        main([command, '--help'])\n    except SystemExit:\n        pass\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr
    assert "--numa-binding" in done.stdout and "--shutdown-timeout" in done.stdout


@pytest.mark.parametrize("dest", [flag.dest for flag in HERE])
def test_each_passed_on_option_means_what_it_means_to_torchrun(
    dest: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubeddp train OPTION VALUE t.py: torchrun's parser gets the value torchrun itself would
    parse from the same words (or kubeddp does it: --no-python, --run-path)."""
    _no_pet(monkeypatch)
    flag = BY_DEST[dest]
    value = _sample(flag)
    words = [flag.options[0]] + ([] if value is None else [value])
    args, _ = parse_command_line(train_parser(), words)
    in_a_pod, _ = parse_command_line(launch_parser(), words)  # launch passes it on alike
    assert in_a_pod.torchrun_flags == args.torchrun_flags
    if dest in DONE_HERE:
        assert args.torchrun_flags == [] and torchrun_cli.torchrun_option(args, dest)
        return
    plan = plan_from_env({}, WORKER_ARGS, nproc_flag="1", torchrun_flags=args.torchrun_flags)
    ours = vars(torchrun_args(plan))[dest]
    torchrun_itself = vars(get_args_parser().parse_args([*words, "train.py"]))[dest]
    assert ours == torchrun_itself
    assert ours not in (None, False, get_args_parser().get_default(dest))


def test_a_flag_newer_than_the_installed_torch_is_refused_in_one_line() -> None:
    args, _ = parse_command_line(train_parser(), ["--numa-binding", "node", "--tee", "3"])
    assert torchrun_cli.too_new(args, (2, 9, 0)) is None
    assert torchrun_cli.too_new(args, None) is None
    assert torchrun_cli.too_new(args, (2, 8, 1)) == (
        "--numa-binding needs torch 2.9 or later (its torchrun added it), and torch 2.8.1 is "
        "installed; upgrade torch or drop --numa-binding"
    )


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


# torchrun's own command lines: the same words go to torchrun's real parser and to kubeddp's,
# which must agree on the program, what it receives and every setting the line gives.
TORCHRUN_LINES = {
    "a flag of ours after the script": "--nproc-per-node 2 t.py --nproc-per-node 1",
    "--log-dir after the script": "--nproc_per_node=2 t.py --log-dir tb",
    "--log-dir on both sides": "--nproc-per-node 2 --log-dir logs t.py --log-dir tb",
    "positional numbers": "t.py 4 2",
    "--standalone twice": "--standalone --nproc-per-node 2 t.py --standalone",
    "short flags": "--tee 3 -r 1 t.py -t 2",
    "static nodes": "--nnodes 2 --node-rank 1 --master-addr h --master-port 29600 t.py "
                    "--node-rank 0",
    "elastic": "--nnodes 1:3 --rdzv-backend c10d --rdzv-endpoint h:29400 --rdzv-id job t.py "
               "--epochs 3",
    "-m MODULE": "--nproc-per-node 2 -m pkg.train --x 1",
    "bare --module": "--module --nproc-per-node 2 pkg.train a",
    "-- after the script": "t.py -- --x",
    "-- among the script's": "t.py a -- b",
    "-m after the script": "--nproc-per-node=2 t.py -m x",
    "--no-python": "--no-python ./run.sh a --tee 1",
    "--run-path": "--run-path t.py a",
    "agent flags": "--monitor-interval 0.5 --start-method fork --numa-binding node "
                   "--local-ranks-filter 0 --role r t.py --role s",
    "unambiguous prefix": "--nnode 1 --nproc-per 2 t.py",
}  # fmt: skip
# kubeddp's own `--script PATH` / `--module NAME` form (torchrun has none): the program ends
# kubeddp's options as torchrun's program word does. line -> (workers, the program's arguments,
# torchrun settings the line gives).
SCRIPT_LINES: dict[str, tuple[str, int, list[str], dict[str, Any]]] = {
    "the issue's --nproc": ("--nproc 2 --script t.py --nproc 1", 2, ["--nproc", "1"], {}),
    "the issue's --log-dir": (
        "--nproc 2 --script t.py --log-dir tb", 2, ["--log-dir", "tb"], {"log_dir": None}),
    "the issue's positional numbers": ("--script t.py 4 2", 1, ["4", "2"], {}),
    "--script=": ("--nproc 2 --script=t.py --nproc 1", 2, ["--nproc", "1"], {}),
    "--module NAME": ("--nproc 2 --module pkg.train --tee 1", 2, ["--tee", "1"], {"tee": "0"}),
    "-- after --script": ("--script t.py -- --epochs 3", 1, ["--epochs", "3"], {}),
    "flags before, the same after": (
        "--nproc 2 --tee 3 --script t.py --tee 1 --nproc 4", 2, ["--tee", "1", "--nproc", "4"],
        {"tee": "3"}),
}  # fmt: skip


@pytest.fixture
def programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """t.py, an executable run.sh and a module pkg.train in the working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("print('t')\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
    return tmp_path


def _kubeddp_sees(words: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(torchrun's namespace for the plan kubeddp runs, the program's arguments)."""
    args, rest = parse_command_line(train_parser(), words)
    launch_plan = plan_launch(args, rest, {})
    parsed = torchrun_args(launch_plan.rdzv)
    runner = parsed.training_script_args  # RUNNER mode target ARGS...
    assert runner[:2] == [launch_plan.program.mode, launch_plan.program.target]
    return parsed, runner[2:]


SETTINGS_NOT_COMPARED = {"module", "no_python", "run_path", "training_script",
                         "training_script_args", "help"}  # fmt: skip


def _same(dest: str, ours: object, theirs: object) -> bool:
    """One setting, as torchrun means it (`--nnodes 1` and a standalone plan's 1:1 alike)."""
    if dest == "nnodes":
        return {str(ours), f"{ours}:{ours}"} & {str(theirs), f"{theirs}:{theirs}"} != set()
    return ours == theirs


@pytest.mark.parametrize("case", TORCHRUN_LINES)
def test_kubeddp_and_torchrun_agree_on_a_command_line(
    case: str, programs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_pet(monkeypatch)
    words = TORCHRUN_LINES[case].split()
    parser = get_args_parser()
    theirs = parser.parse_args(words)
    ours, program_args = _kubeddp_sees(words)
    assert program_args == theirs.training_script_args
    given = {
        a.dest
        for a in parser._actions
        for w in words[: words.index(theirs.training_script)]
        if w.startswith("-") and any(o.startswith(w.split("=")[0]) for o in a.option_strings)
    }
    for dest in sorted(given - SETTINGS_NOT_COMPARED):
        assert _same(dest, vars(ours)[dest], vars(theirs)[dest]), dest


@pytest.mark.parametrize("case", SCRIPT_LINES)
def test_the_script_option_ends_kubeddps_options(
    case: str, programs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_pet(monkeypatch)
    line, workers, wanted, settings = SCRIPT_LINES[case]
    ours, program_args = _kubeddp_sees(line.split())
    assert program_args == wanted
    assert vars(ours)["nproc_per_node"] == str(workers)
    assert {dest: vars(ours)[dest] for dest in settings} == settings


def test_a_word_torchrun_cannot_take_after_the_script_is_the_scripts(
    programs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`torchrun t.py --nproc 2`: torchrun's parser stops on an ambiguous prefix of its own
    options even after the script (argparse reads every word); kubeddp gives the script the
    words, as torchrun means to."""
    _no_pet(monkeypatch)
    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["t.py", "--nproc", "2"])
    _, program_args = _kubeddp_sees(["t.py", "--nproc", "2"])
    assert program_args == ["--nproc", "2"]


SPLIT = {
    # kubeddp train argv -> (own options, the program's arguments or after --)
    "torchrun form": (["--nproc_per_node=2", "t.py", "--log", "5"],
                      (["--nproc_per_node=2", "--script", "t.py"], ["--log", "5"])),
    "-- after the program": (["t.py", "--", "--x"], (["--script", "t.py"], ["--x"])),
    "bare --module flag": (["--module", "--tee", "3", "pkg.train", "1"],
                           (["--tee", "3", "--module", "pkg.train"], ["1"])),
    "-m NAME": (["--role", "r", "-m", "pkg.train", "1"],
                (["--role", "r", "-m", "pkg.train"], ["1"])),
    "value flags skipped": (["-r", "3", "--log-dir", "d", "--no-python", "run.sh"],
                            (["-r", "3", "--log-dir", "d", "--no-python", "--script", "run.sh"],
                             [])),
    "--script ends kubeddp's options": (["--nproc", "2", "--script", "t.py", "--nproc", "1"],
                                        (["--nproc", "2", "--script", "t.py"], ["--nproc", "1"])),
    "--script=": (["--script=t.py", "--dry-run"], (["--script=t.py"], ["--dry-run"])),
    "-mNAME": (["-mpkg", "--x"], (["-mpkg"], ["--x"])),
    "the built-in trainer's --": (["--nproc", "2", "--", "--config", "c.yaml"],
                                  (["--nproc", "2"], ["--config", "c.yaml"])),
    "--script without its value": (["--nproc", "2", "--script"],
                                   (["--nproc", "2", "--script"], [])),
}  # fmt: skip


@pytest.mark.parametrize("case", SPLIT)
def test_split_command_line(case: str) -> None:
    argv, want = SPLIT[case]
    assert torchrun_cli.split_command_line(train_parser(), argv) == want
