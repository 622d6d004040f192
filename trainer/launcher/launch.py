"""`kubeddp launch` (the image entrypoint) and `kubeddp train` (the laptop shorthand).

env -> RendezvousPlan -> wait for the rendezvous host -> torchrun's elastic agent, in process.
The config is loaded here, once: launch checks it, sizes the metrics endpoint and the shutdown
grace from it, and hands it to the workers.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping

from kubeddp.trainer import constants, exit_codes
from kubeddp.trainer.arguments import OneLineErrorParser, number
from kubeddp.trainer.config import (
    Config,
    ConfigError,
    add_config_options,
    config_options_argv,
    load_config_options,
    resolved_config_env,
)
from kubeddp.trainer.launcher.agent import WORKER_MODULE, run_torchrun
from kubeddp.trainer.launcher.metrics_server import MetricsSetupError, start_for_launch
from kubeddp.trainer.launcher.program_options import (
    ProgramError,
    add_program_options,
    check_overrides,
    program_from_options,
    torchrun_worker_args,
)
from kubeddp.trainer.launcher.rendezvous import NodeFlags, RendezvousError, plan_from_env
from kubeddp.trainer.launcher.stall_watch import start_diagnostics
from kubeddp.trainer.launcher.torch_check import installed_torch_problem
from kubeddp.trainer.launcher.wait import RendezvousHostUnreachable, wait_for_rendezvous_host
from kubeddp.trainer.worker.program import RUNNER_MODULE, Program

DEFAULT_RDZV_WAIT_SECONDS = 600.0
MAX_RDZV_WAIT_SECONDS = 7 * 24 * 3600.0  # a finite bound: nan or inf would wait forever
MAX_RESTARTS = 10_000


def _split_worker_args(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _compile_problem(cfg: Config) -> str | None:
    """train.compile=on where torch.compile cannot build its kernels: said once, before any
    rendezvous wait (workers that a user's own torchrun starts check it themselves)."""
    if cfg.train.compile == "off":
        return None
    from kubeddp.trainer.worker.compiled import compile_plan
    from kubeddp.trainer.worker.distributed import DistributedSetupError, choose_device

    try:
        compile_plan(cfg.train.compile, choose_device(cfg.ddp, 0))
    except DistributedSetupError:
        return None  # no such device: each worker says so, as without compile
    except ValueError as exc:
        return str(exc)
    return None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """torchrun's multi-node flags, for hosts that no operator set up (bare metal)."""
    group = parser.add_argument_group(
        "several hosts without Kubernetes (as torchrun; these win over the environment)"
    )
    group.add_argument("--nnodes", metavar="N|MIN:MAX", help="nodes in the job")
    group.add_argument("--node-rank", type=int, metavar="R", help="this node's rank, 0..N-1")
    group.add_argument("--master-addr", metavar="HOST", help="the host of node rank 0")
    group.add_argument(
        "--master-port",
        type=int,
        metavar="PORT",
        help=f"its rendezvous port (default {constants.TORCHRUN_PORT})",
    )
    group.add_argument(
        "--rdzv-endpoint", metavar="HOST:PORT", help="elastic: the c10d rendezvous store"
    )
    group.add_argument("--rdzv-id", metavar="ID", help="elastic: the job's id (default kubeddp)")


def node_flags(args: argparse.Namespace) -> NodeFlags:
    return NodeFlags(
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
    )


def node_flags_argv(args: argparse.Namespace) -> list[str]:
    """The multi-node flags as launch arguments (what `kubeddp train` forwards)."""
    argv: list[str] = []
    for option in ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_endpoint"):
        value = getattr(args, option)
        if value is not None:
            argv += ["--" + option.replace("_", "-"), str(value)]
    if args.rdzv_id is not None:
        argv += ["--rdzv-id", args.rdzv_id]
    return argv


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
        help="torchrun worker-group restarts before failing",
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


def config_options(
    own: argparse.Namespace, after_dash: list[str]
) -> tuple[argparse.Namespace, list[str]]:
    """Launch's own --config/--set and those after `--` as one set of options, and the worker
    arguments that stand for them (what follows `--` is kept as written)."""
    parser = OneLineErrorParser(prog="kubeddp worker", description="worker arguments")
    add_config_options(parser)
    theirs = parser.parse_args(after_dash)  # an unknown flag: one line, exit 2
    if own.config and theirs.config:
        raise ConfigError(
            f"--config is given before and after -- ({own.config}, {theirs.config}); keep one"
        )
    merged = argparse.Namespace(
        config=theirs.config or own.config, overrides=[*own.overrides, *theirs.overrides]
    )
    return merged, [*config_options_argv(own.config, own.overrides), *after_dash]


def _env_number(env: Mapping[str, str], name: str, kind: type, default: float = 0) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise RendezvousError(f"{name}={raw!r} is not a number; set a number or unset it") from None
    if not math.isfinite(value) or value < 0:
        raise RendezvousError(f"{name}={raw!r} must be a finite number >= 0; set one or unset it")
    return value


def _worker_command(
    args: argparse.Namespace, after_dash: list[str]
) -> tuple[argparse.Namespace, Program | None, list[str]]:
    """The config options, the user's program (None: the built-in trainer) and the worker
    arguments torchrun passes on."""
    program = program_from_options(args.script, args.module, after_dash)
    if program is None:
        options, worker_args = config_options(args, after_dash)
        return options, None, worker_args
    check_overrides(args.overrides, "--script" if args.script is not None else "--module")
    options = argparse.Namespace(config=args.config, overrides=list(args.overrides))
    return options, program, torchrun_worker_args(program)


def launch_main(argv: list[str]) -> int:
    own, after_dash = _split_worker_args(argv)
    args = launch_parser().parse_args(own)
    env = os.environ
    problem = installed_torch_problem() if env.get(constants.ENV_SKIP_TORCH_CHECK) != "1" else None
    if problem:
        _log(f"kubeddp launch: error: {problem}")
        return exit_codes.BAD_INPUT
    try:
        options, program, worker_args = _worker_command(args, after_dash)
        gpus = (
            _gpu_count
            if not args.dry_run or env.get(constants.ENV_DRY_RUN_GPUS) is None
            else (lambda: _env_number(env, constants.ENV_DRY_RUN_GPUS, int))
        )
        plan = plan_from_env(
            env,
            worker_args,
            nproc_flag=args.nproc_per_node,
            max_restarts=args.max_restarts,
            gpu_count=gpus,
            worker_module=RUNNER_MODULE if program is not None else WORKER_MODULE,
            node_flags=node_flags(args),
        )
    except (ConfigError, RendezvousError, ProgramError) as exc:
        _log(f"kubeddp launch: error: {exc}")
        return exit_codes.BAD_INPUT
    if args.dry_run:
        print(plan.to_json())
        return 0
    try:
        # Loaded here, not in each worker: a typo is one line now, not a traceback per worker.
        cfg = load_config_options(options, env)
        problem = _compile_problem(cfg) if program is None else None
        if problem:
            raise ConfigError(problem)
        deadline = args.rdzv_wait
        if deadline is None:
            deadline = _env_number(
                env, constants.ENV_RDZV_WAIT_SECONDS, float, DEFAULT_RDZV_WAIT_SECONDS
            )
            if deadline > MAX_RDZV_WAIT_SECONDS:
                raise RendezvousError(
                    f"{constants.ENV_RDZV_WAIT_SECONDS}={deadline:g} is more than a week "
                    f"({MAX_RDZV_WAIT_SECONDS:g} s); set a shorter wait"
                )
    except (ConfigError, RendezvousError) as exc:
        _log(f"kubeddp launch: error: {exc}")
        return exit_codes.BAD_INPUT
    _log(
        f"[kubeddp] rendezvous: {plan.source}, nodes {plan.nnodes}, {plan.nproc_per_node} "
        f"workers/node, endpoint {plan.rdzv_endpoint} ({plan.rdzv_backend})"
    )
    if program is not None:
        _log(f"[kubeddp] program: {program.command_line()}")
    if plan.source == "torchrun":  # this process is already one of torchrun's workers
        if program is not None:
            from kubeddp.trainer.worker.program import run_program

            os.environ.update(resolved_config_env(cfg))  # the runner reads the SIGTERM grace
            return run_program(program)
        from kubeddp.trainer.worker.entry import run

        return run(cfg)
    try:
        wait_for_rendezvous_host(plan, deadline, _log)
    except RendezvousHostUnreachable as exc:
        code = exit_codes.RDZV_UNREACHABLE
        _log(f"kubeddp launch: error: {exc}; exit code {exit_codes.describe(code)}")
        return code
    try:
        metrics = start_for_launch(cfg.metrics, plan.in_kubernetes, _log)
    except MetricsSetupError as exc:
        _log(f"kubeddp launch: error: {exc}")
        return exit_codes.BAD_INPUT
    code = exit_codes.TRAINING_FAILED
    watch = start_diagnostics(cfg, metrics, _log)
    worker_env = {**resolved_config_env(cfg), **(watch.env if watch else {})}
    try:
        code = run_torchrun(plan, worker_env, cfg.checkpoint.preempt_grace_seconds)
    finally:
        if watch is not None:
            code = watch.finish(code)
        if metrics is not None:
            metrics.finish(code, _log)
        if watch is not None:
            watch.remove()  # after the metrics' linger: its last scrapes still read the records
    return code


def train_main(argv: list[str]) -> int:
    """`kubeddp train --nproc 2 [--config F] [--set k=v ...]`: launch on this machine."""
    own, after_dash = _split_worker_args(argv)
    p = OneLineErrorParser(
        prog="kubeddp train",
        description="train on this machine (or, with --nnodes, on several hosts); with "
        "--script/--module your own program runs and everything after -- goes to it",
    )
    p.add_argument("--nproc", default=None, help="worker processes (default: GPUs, else 1)")
    p.add_argument("--max-restarts", type=number(int, 0, high=MAX_RESTARTS), default=None)
    p.add_argument("--dry-run", action="store_true")
    add_config_options(p)
    add_program_options(p)
    add_node_options(p)
    args = p.parse_args(own)
    launch_args = []
    if args.nproc:
        launch_args += ["--nproc-per-node", str(args.nproc)]
    if args.max_restarts is not None:
        launch_args += ["--max-restarts", str(args.max_restarts)]
    if args.dry_run:
        launch_args.append("--dry-run")
    launch_args += config_options_argv(args.config, args.overrides)
    launch_args += node_flags_argv(args)
    if args.script is not None:
        launch_args += ["--script", args.script]
    if args.module is not None:
        launch_args += ["--module", args.module]
    return launch_main([*launch_args, "--", *after_dash])
