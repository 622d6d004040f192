"""`kubeddp launch` (the image entrypoint) and `kubeddp train` (the laptop shorthand): their
command lines, mapped onto one launch.

env -> LaunchPlan (launch_plan.py: the rendezvous plan, the program, the config, checked before
anything waits) -> the pod's life (pod.py: keeper, retry budget, torchrun's agent in process).
The config is loaded once, by the plan: launch checks it, sizes the metrics endpoint and the
shutdown grace from it, and hands it to the workers.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from kubeddp.trainer import constants, exit_codes
from kubeddp.trainer.arguments import OneLineErrorParser, number
from kubeddp.trainer.common import installed_torch_version
from kubeddp.trainer.config import ConfigError, add_config_options
from kubeddp.trainer.launcher import command_name, end_signals, scratch, torch_check, torchrun_cli
from kubeddp.trainer.launcher.launch_plan import (
    MAX_RDZV_WAIT_SECONDS,
    dry_run,
    plan_launch,
    preflight,
)
from kubeddp.trainer.launcher.pod import run_launch
from kubeddp.trainer.launcher.program_options import ProgramError, add_program_options
from kubeddp.trainer.launcher.rendezvous import RendezvousError
from kubeddp.trainer.launcher.torchrun_cli import spellings

MAX_RESTARTS = 10_000


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """torchrun's multi-node flags, for hosts that no operator set up (bare metal)."""
    group = parser.add_argument_group(
        "several hosts without Kubernetes (as torchrun; these win over the environment)"
    )
    group.add_argument("--nnodes", metavar="N|MIN:MAX", help="nodes in the job")
    group.add_argument(
        *spellings("--node-rank"), type=int, metavar="R", help="this node's rank, 0..N-1"
    )
    group.add_argument(*spellings("--master-addr"), metavar="HOST", help="the host of node rank 0")
    group.add_argument(
        *spellings("--master-port"),
        type=int,
        metavar="PORT",
        help=f"its rendezvous port (default {constants.TORCHRUN_PORT})",
    )
    group.add_argument(
        *spellings("--rdzv-endpoint"),
        metavar="HOST:PORT",
        help="elastic: the c10d rendezvous store",
    )
    group.add_argument(
        *spellings("--rdzv-id"), metavar="ID", help="elastic: the job's id (default kubeddp)"
    )


LAUNCH_DESCRIPTION = (
    "Start DDP training from whatever launched this process (torchrun, PyTorchJob, elastic "
    "PyTorchJob, TrainJob, Indexed Job, plain env, or nothing). Without a program the built-in "
    "trainer runs, and --config/--set may also follow -- (as the manifests pass them); with "
    "--script/--module (or torchrun's PATH form) everything after the program is the "
    "program's. torchrun's flags are taken as `kubeddp train` takes them."
)
TRAIN_DESCRIPTION = (
    "train on this machine (or, with --nnodes, on several hosts); with --script/--module your "
    "own program runs, and everything after it is the program's, as with torchrun. torchrun's "
    "form works as well: kubeddp train [torchrun flags] train.py ARGS (or -m MODULE ARGS)"
)


def command_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """`kubeddp launch`'s and `kubeddp train`'s options: the same, under torchrun's names where
    torchrun has the option (torchrun's other flags from the table in torchrun_flags.py: no
    torch import, so --help is quick)."""
    p = OneLineErrorParser(prog=prog, description=description)
    p.add_argument(
        *("--nproc-per-node", "--nproc", "--nproc_per_node"),
        dest="nproc_per_node",
        default=None,
        metavar="N",
        help="workers on this node: N, auto, gpu or cpu (default: from the env, else one per "
        "visible GPU, else $KUBEDDP_CPU_NPROC or 1)",
    )
    p.add_argument(
        *spellings("--max-restarts"),
        type=number(int, 0, high=MAX_RESTARTS),
        default=None,
        help="torchrun's restarts of this node's worker group before it fails (in a pod: the "
        "operator's retries of the pod come after, and launch's own budget "
        "retries.without_progress bounds those)",
    )
    p.add_argument(
        "--standalone", action="store_true", help="one node, local rendezvous (the default)"
    )
    p.add_argument(
        *spellings("--rdzv-backend"),
        choices=torchrun_cli.RDZV_BACKENDS,
        default=None,
        help="static with --master-addr, c10d with --rdzv-endpoint (chosen from those)",
    )
    p.add_argument(
        "--rdzv-wait",
        type=number(float, 0, high=MAX_RDZV_WAIT_SECONDS),
        default=None,
        help="seconds to wait for the rendezvous host's DNS name and port "
        f"(default ${constants.ENV_RDZV_WAIT_SECONDS} or 600)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan as JSON and exit")
    add_config_options(p)
    add_program_options(p)
    add_node_options(p)
    torchrun_cli.add_torchrun_options(p)
    return p


def launch_parser() -> argparse.ArgumentParser:
    return command_parser("kubeddp launch", LAUNCH_DESCRIPTION)


def train_parser() -> argparse.ArgumentParser:
    return command_parser("kubeddp train", TRAIN_DESCRIPTION)


def parse_command_line(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, list[str]]:
    """(launch's options, the program's arguments or, without a program, what followed `--`):
    torchrun's command line, checked as torchrun would, with what kubeddp passes on to its
    agent (`torchrun_flags`, `no_python`)."""
    own, rest = torchrun_cli.split_command_line(parser, argv)
    args = parser.parse_args(own)
    for problem in (
        torchrun_cli.check_standalone(args),
        torchrun_cli.check_rdzv_backend(args),
        torchrun_cli.too_new(args, torch_check.release(installed_torch_version())),
    ):
        if problem:
            parser.error(problem)
    args.torchrun_flags = torchrun_cli.passed_on(args)
    args.no_python = torchrun_cli.torchrun_option(args, "no_python")
    return args, rest


def launch_main(argv: list[str]) -> int:
    """A SIGTERM/SIGINT at any moment ends launch with 128 + N (end_signals.py)."""
    return _with_end_signals(lambda: _launch(argv))


def _with_end_signals(body: Callable[[], int]) -> int:
    previous = end_signals.install()
    try:
        return body()
    except Exception as exc:
        code = end_signals.exit_code_of(exc)
        if code is None:
            raise
        return code
    finally:
        end_signals.restore(previous)  # launch may run inside a test; at exit: ignored


def _launch(argv: list[str]) -> int:
    return launch_with(*parse_command_line(launch_parser(), argv))


def launch_with(
    args: argparse.Namespace, after_dash: list[str], warnings: Callable[[], None] = lambda: None
) -> int:
    """plan -> preflight -> run, for `kubeddp launch` and `kubeddp train` alike: `args` holds
    launch_parser's options, `after_dash` what followed `--`. `warnings` prints advice once the
    plan stands (a refused plan is one line, alone)."""
    env = os.environ
    if env.get(constants.ENV_SKIP_TORCH_CHECK) != "1":
        problem = torch_check.installed_torch_problem()
        if problem:
            return _bad_input(problem)
        newer = torch_check.installed_torch_note()
        if newer:
            _log(command_name.note(newer))
    try:
        launch_plan = plan_launch(args, after_dash, env)
    except (ConfigError, RendezvousError, ProgramError) as exc:
        return _bad_input(exc)
    warnings()
    if args.dry_run:
        return dry_run(launch_plan)
    try:
        cfg, deadline = preflight(args, launch_plan, env)
        return run_launch(launch_plan, cfg, deadline, env)
    except (ConfigError, RendezvousError, scratch.ScratchError) as exc:
        return _bad_input(exc)


def _bad_input(problem: object) -> int:
    _log(command_name.error(problem))
    return exit_codes.BAD_INPUT


def train_main(argv: list[str]) -> int:
    """`kubeddp train --nproc 2 [--config F] [--set k=v ...]`: launch on this machine; torchrun's
    own command line works too (`kubeddp train --nproc_per_node=2 train.py --epochs 3`)."""
    args, after = parse_command_line(train_parser(), argv)
    with command_name.running(command_name.TRAIN):
        return _with_end_signals(lambda: launch_with(args, after, lambda: _warn(args, after)))


def _warn(args: argparse.Namespace, after_dash: list[str]) -> None:
    """The pitfalls `kubeddp check` would name in the script, as warnings."""
    if args.script is None:
        return
    from kubeddp.trainer.script_check.checks import warnings_for

    warned = warnings_for(args.script, args.nnodes, after_dash)
    if not any(" spawn-several-nodes: " in line for line in warned):  # launch refuses it
        for line in warned:
            _log(f"kubeddp train: warning: {line}")
