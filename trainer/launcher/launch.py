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
from kubeddp.trainer.config import ConfigError, add_config_options
from kubeddp.trainer.launcher import command_name, end_signals, scratch, torchrun_cli
from kubeddp.trainer.launcher.launch_plan import (
    MAX_RDZV_WAIT_SECONDS,
    checked_settings,
    dry_run,
    plan_launch,
    preflight,
)
from kubeddp.trainer.launcher.pod import run_launch
from kubeddp.trainer.launcher.program_options import ProgramError, add_program_options
from kubeddp.trainer.launcher.rendezvous import RendezvousError
from kubeddp.trainer.launcher.torch_check import installed_torch_problem
from kubeddp.trainer.launcher.torchrun_cli import spellings

MAX_RESTARTS = 10_000


def _split_worker_args(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


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


def launch_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="kubeddp launch",
        description="Start DDP training from whatever launched this process (torchrun, "
        "PyTorchJob, elastic PyTorchJob, TrainJob, Indexed Job, plain env, or nothing). "
        "Without --script/--module the built-in trainer runs, and --config/--set may also "
        "follow -- (as the manifests pass them); with one, everything after -- goes to that "
        "program.",
    )
    p.add_argument(
        "--nproc-per-node",
        default=None,
        help="workers on this node: N, auto, gpu or cpu (default: from the env, "
        "else one per visible GPU, else $KUBEDDP_CPU_NPROC or 1)",
    )
    p.add_argument(
        "--max-restarts",
        type=number(int, 0, high=MAX_RESTARTS),
        default=None,
        help="torchrun's restarts of this pod's worker group before the pod fails (in the "
        "pod; the operator's retries of the pod come after, and launch's own budget "
        "retries.without_progress bounds those)",
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
    return p


def launch_main(argv: list[str]) -> int:
    """A SIGTERM/SIGINT at any moment ends launch with its code (end_signals.py)."""
    return _with_end_signals(lambda: _launch(argv))


def _with_end_signals(body: Callable[[], int]) -> int:
    previous = end_signals.install()
    try:
        return _documented(body())
    except Exception as exc:
        code = end_signals.exit_code_of(exc)
        if code is None:
            raise
        return code
    finally:
        end_signals.restore(previous)  # launch may run inside a test; at exit: ignored


def _documented(code: int) -> int:
    """The pod's code as the exit-code table names it: a code of 128 or more that no row names
    (a program's own choice under torchrun, or a path that kept a signal's 128 + N) is CRASHED,
    said in one line: the operators act on the table's codes alone."""
    named = exit_codes.documented(code)
    if named != code:
        _log(f"[kubeddp] exit code {code} is not one of kubeddp's: exit code "
             f"{exit_codes.describe(named)} (docs/exit-codes.md)")  # fmt: skip
    return named


def _launch(argv: list[str]) -> int:
    own, after_dash = _split_worker_args(argv)
    return launch_with(launch_parser().parse_args(own), after_dash)


def launch_with(
    args: argparse.Namespace, after_dash: list[str], warnings: Callable[[], None] = lambda: None
) -> int:
    """plan -> preflight -> run, for `kubeddp launch` and `kubeddp train` alike: `args` holds
    launch_parser's options, `after_dash` what followed `--`. `warnings` prints advice once the
    plan stands (a refused plan is one line, alone)."""
    env = os.environ
    problem = installed_torch_problem() if env.get(constants.ENV_SKIP_TORCH_CHECK) != "1" else None
    if problem:
        return _bad_input(problem)
    try:
        launch_plan = plan_launch(args, after_dash, env)
    except (ConfigError, RendezvousError, ProgramError) as exc:
        return _bad_input(exc)
    warnings()
    if args.dry_run:
        try:  # what the real start would refuse, a dry run refuses (no wait, no process)
            checked_settings(args, launch_plan, env)
        except (ConfigError, RendezvousError) as exc:
            return _bad_input(exc)
        return dry_run(launch_plan)
    try:
        cfg, deadline = preflight(args, launch_plan, env)
        return run_launch(launch_plan, cfg, deadline, env)
    except (ConfigError, RendezvousError, scratch.ScratchError) as exc:
        return _bad_input(exc)


def _bad_input(problem: object) -> int:
    _log(command_name.error(problem))
    return exit_codes.BAD_INPUT


def train_parser(torchrun_options: bool = True) -> argparse.ArgumentParser:
    """`kubeddp train`'s options (torchrun's flags among them; `torchrun_options=False`: only
    the ones kubeddp defines, without importing torch)."""
    p = OneLineErrorParser(
        prog="kubeddp train",
        description="train on this machine (or, with --nnodes, on several hosts); with "
        "--script/--module your own program runs and everything after -- goes to it. "
        "torchrun's form works as well: kubeddp train [torchrun flags] train.py ARGS "
        "(or -m MODULE ARGS)",
    )
    p.add_argument(
        *("--nproc", *spellings("--nproc-per-node")),
        dest="nproc",
        default=None,
        help="worker processes: N, auto, gpu or cpu (default: GPUs, else 1)",
    )
    p.add_argument(
        *spellings("--max-restarts"), type=number(int, 0, high=MAX_RESTARTS), default=None
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
    p.add_argument("--dry-run", action="store_true")
    add_config_options(p)
    add_program_options(p)
    add_node_options(p)
    p.add_argument("-m", dest="module", metavar="MODULE", help="as --module (torchrun's -m)")
    if torchrun_options:
        torchrun_cli.add_torchrun_options(p)
    return p


def train_main(argv: list[str]) -> int:
    """`kubeddp train --nproc 2 [--config F] [--set k=v ...]`: launch on this machine; torchrun's
    own command line works too (`kubeddp train --nproc_per_node=2 train.py --epochs 3`)."""
    p = train_parser()
    positional = torchrun_cli.split_program(p, argv)
    if positional is None:
        own, after_dash = _split_worker_args(argv)
    else:
        own, program, after_program = positional
        own, after_dash = [*own, *program], torchrun_cli.program_arguments(after_program)
    args = p.parse_args(own)
    for problem in (torchrun_cli.check_standalone(args), torchrun_cli.check_rdzv_backend(args)):
        if problem:
            p.error(problem)
    options = _as_launch_options(args)
    with command_name.running(command_name.TRAIN):
        return _with_end_signals(
            lambda: launch_with(options, after_dash, lambda: _warn(args, after_dash))
        )


def _warn(args: argparse.Namespace, after_dash: list[str]) -> None:
    """The pitfalls `kubeddp check` would name in the script, as warnings."""
    if args.script is None:
        return
    from kubeddp.trainer.script_check.checks import warnings_for

    warned = warnings_for(args.script, args.nnodes, after_dash)
    if not any(" spawn-several-nodes: " in line for line in warned):  # launch refuses it
        for line in warned:
            _log(f"kubeddp train: warning: {line}")


def _as_launch_options(args: argparse.Namespace) -> argparse.Namespace:
    """`kubeddp train`'s parsed options under launch's names (launch's defaults for the rest)."""
    options = launch_parser().parse_args([])
    options.nproc_per_node = args.nproc or None
    options.max_restarts = args.max_restarts
    options.dry_run = args.dry_run
    options.config = args.config or None
    options.overrides = list(args.overrides)
    options.script, options.module = args.script, args.module
    options.spawns_workers = args.spawns_workers
    for name in ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_endpoint", "rdzv_id"):
        setattr(options, name, getattr(args, name))
    options.torchrun_flags = torchrun_cli.passed_on(args, torchrun_cli.torchrun_actions())
    options.no_python = torchrun_cli.torchrun_option(args, "no_python")
    return options
