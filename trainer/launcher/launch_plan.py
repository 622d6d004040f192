"""What launch will do, decided before anything is touched: the rendezvous plan, the program,
the config and the rendezvous wait (all a dry run prints, all checked before any wait).

Pure but for reading the files the options name: the pod's life (pod.py) runs the plan, the
command line (launch.py) maps options to it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from kubeddp.trainer import constants, endpoints
from kubeddp.trainer.config import (
    Config,
    ConfigError,
    DDPConfig,
    TrainConfig,
    load_config_options,
    parse_config_options,
)
from kubeddp.trainer.launcher import scratch, trainjob_status
from kubeddp.trainer.launcher.agent import WORKER_MODULE
from kubeddp.trainer.launcher.program_options import (
    ProgramError,
    check_config_file,
    check_overrides,
    program_from_options,
    program_spawns_workers,
    spawn_refusal,
    torchrun_worker_args,
)
from kubeddp.trainer.launcher.rendezvous import (
    NodeFlags,
    RendezvousError,
    RendezvousPlan,
    plan_from_env,
)
from kubeddp.trainer.worker.program import RUNNER_MODULE, Program

# Imported in functions: torch (devices and compiled import it too): `kubeddp train --help` imports
# this module and must not import torch (tests/unit/test_torchrun_args.py).

DEFAULT_RDZV_WAIT_SECONDS = 600.0
MAX_RDZV_WAIT_SECONDS = 7 * 24 * 3600.0  # a finite bound: nan or inf would wait forever


@dataclass
class LaunchPlan:
    """What launch will do, decided before anything is touched (all a dry run prints)."""

    rdzv: RendezvousPlan
    options: argparse.Namespace  # --config/--set, for the built-in trainer or the runner
    program: Program | None  # None: the built-in trainer
    spawns: bool  # the program starts its own workers (mp.spawn): it runs once per node


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _compile_problem(train: TrainConfig, ddp: DDPConfig) -> str | None:
    """train.compile=on where torch.compile cannot build its kernels: said once, before any
    rendezvous wait (workers that a user's own torchrun starts check it themselves)."""
    if train.compile == "off":
        return None
    from kubeddp.trainer.devices import DistributedSetupError, choose_device
    from kubeddp.trainer.worker.compiled import compile_plan

    try:
        compile_plan(train.compile, choose_device(ddp, 0))
    except DistributedSetupError:
        return None  # no such device: each worker says so, as without compile
    except ValueError as exc:
        return str(exc)
    return None


def node_flags(args: argparse.Namespace) -> NodeFlags:
    return NodeFlags(
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
    )


def config_options(own: argparse.Namespace, after_dash: list[str]) -> argparse.Namespace:
    """Launch's own --config/--set and those after `--` (as the manifests pass them) as one
    set of options; the overrides after `--` come last, so they win."""
    theirs = parse_config_options(after_dash, "kubeddp launch")
    if own.config and theirs.config:
        raise ConfigError(
            f"--config is given before and after -- ({own.config}, {theirs.config}); keep one"
        )
    return argparse.Namespace(
        config=theirs.config or own.config, overrides=[*own.overrides, *theirs.overrides]
    )


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
    arguments torchrun passes on: the runner's, for a program; none for the built-in trainer,
    whose workers get the config launch loads in their environment (process_contract.py)."""
    note = (lambda text: _log(f"[kubeddp] {text}")) if args.dry_run else None
    no_python = getattr(args, "no_python", False)  # kubeddp train's torchrun --no-python
    program = program_from_options(args.script, args.module, after_dash, note, no_python)
    if program is None:
        return config_options(args, after_dash), None, []
    option = "--script" if args.script is not None else "--module"
    check_overrides(args.overrides, option)
    check_config_file(args.config or os.environ.get(constants.ENV_CONFIG), option)
    options = argparse.Namespace(config=args.config, overrides=list(args.overrides))
    return options, program, torchrun_worker_args(program)


def plan_launch(
    args: argparse.Namespace, after_dash: list[str], env: Mapping[str, str]
) -> LaunchPlan:
    """The rendezvous plan and the program; raises ConfigError, RendezvousError, ProgramError."""
    options, program, worker_args = _worker_command(args, after_dash)
    spawns = program is not None and program_spawns_workers(program, args.spawns_workers)
    if spawns and args.nproc_per_node not in (None, "1"):
        _log(f"[kubeddp] note: --nproc-per-node {args.nproc_per_node} ignored: the program "
             "starts its own workers; give their count to the program")  # fmt: skip
    gpus = (
        _gpu_count
        if not args.dry_run or env.get(constants.ENV_DRY_RUN_GPUS) is None
        else (lambda: _env_number(env, constants.ENV_DRY_RUN_GPUS, int))
    )
    plan = plan_from_env(
        env,
        worker_args,
        nproc_flag="1" if spawns else args.nproc_per_node,
        max_restarts=args.max_restarts,
        gpu_count=gpus,
        worker_module=RUNNER_MODULE if program is not None else WORKER_MODULE,
        node_flags=node_flags(args),
        torchrun_flags=getattr(args, "torchrun_flags", ()),  # kubeddp train's torchrun options
    )
    refusal = spawn_refusal(program, plan.nnodes) if spawns and program else None
    if refusal:
        raise ProgramError(refusal)
    return LaunchPlan(plan, options, program, spawns)


def dry_run(launch_plan: LaunchPlan) -> int:
    """`--dry-run`: the plan as one JSON object on stdout; nothing is started or waited for."""
    print(launch_plan.rdzv.to_json())
    return 0


def checked_settings(
    args: argparse.Namespace, launch_plan: LaunchPlan, env: Mapping[str, str]
) -> tuple[Config, float]:
    """The config and the rendezvous wait, every key and value checked: what a dry run checks
    too (an unknown config key is refused there, as it would be at the real start)."""
    options = launch_plan.options
    path = options.config or env.get(constants.ENV_CONFIG)
    if args.dry_run and path and not os.path.exists(path):
        # the image's or the ConfigMap's file, not on this machine: the overrides are checked
        _log(f"[kubeddp] note: config file {path} is not on this machine (it may be in the "
             "image or the pod's ConfigMap): only the --set overrides are checked")  # fmt: skip
        options = argparse.Namespace(config=None, overrides=options.overrides)
        env = {k: v for k, v in env.items() if k != constants.ENV_CONFIG}
    # Loaded here, not in each worker: a typo is one line now, not a traceback per worker.
    cfg = load_config_options(options, env)
    problem = _compile_problem(cfg.train, cfg.ddp) if launch_plan.program is None else None
    if problem:
        raise ConfigError(problem)
    for problem in endpoints.problems(env, cfg.checkpoint.dir):  # the keeper's, S3's
        raise ConfigError(problem)
    trainjob_status.check_env(env)
    return cfg, _rdzv_deadline(args.rdzv_wait, env)


def preflight(
    args: argparse.Namespace, launch_plan: LaunchPlan, env: Mapping[str, str]
) -> tuple[Config, float]:
    """The config and the rendezvous wait, checked before any wait or process starts, and the
    machine's scratch space; raises ConfigError, RendezvousError or ScratchError."""
    settings = checked_settings(args, launch_plan, env)
    # launch's agent and its workers write to /tmp: read-only or full, each worker would fail
    problem = scratch.problem() if launch_plan.rdzv.source != "torchrun" else None
    if problem:
        raise scratch.ScratchError(problem)
    return settings


def _rdzv_deadline(flag: float | None, env: Mapping[str, str]) -> float:
    """Seconds to wait for the rendezvous host: --rdzv-wait, else the env, else the default."""
    if flag is not None:
        return flag
    deadline = _env_number(env, constants.ENV_RDZV_WAIT_SECONDS, float, DEFAULT_RDZV_WAIT_SECONDS)
    if deadline > MAX_RDZV_WAIT_SECONDS:
        raise RendezvousError(
            f"{constants.ENV_RDZV_WAIT_SECONDS}={deadline:g} is more than a week "
            f"({MAX_RDZV_WAIT_SECONDS:g} s); set a shorter wait"
        )
    return deadline
