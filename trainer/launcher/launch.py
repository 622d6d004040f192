"""`kubeddp launch` (the image entrypoint) and `kubeddp train` (the laptop shorthand).

env -> RendezvousPlan -> wait for the rendezvous host -> torchrun's elastic agent, in process.
The config is loaded here, once: launch checks it, sizes the metrics endpoint and the shutdown
grace from it, and hands it to the workers.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubeddp.trainer import constants, exit_codes
from kubeddp.trainer.arguments import OneLineErrorParser, number
from kubeddp.trainer.config import (
    Config,
    ConfigError,
    DDPConfig,
    TrainConfig,
    add_config_options,
    config_options_argv,
    load_config_options,
    resolved_config_env,
)
from kubeddp.trainer.launcher import (
    checkpoint_sync,
    command_name,
    end_signals,
    finished_run,
    scratch,
    torchrun_cli,
)
from kubeddp.trainer.launcher.agent import WORKER_MODULE, Outcome, run_agent
from kubeddp.trainer.launcher.metrics_server import (
    MetricsSetupError,
    PodMetricsEndpoint,
    start_for_launch,
)
from kubeddp.trainer.launcher.program_options import (
    ProgramError,
    add_program_options,
    check_config_file,
    check_overrides,
    program_fingerprint,
    program_from_options,
    program_spawns_workers,
    spawn_refusal,
    torchrun_worker_args,
)
from kubeddp.trainer.launcher.rejoin import RendezvousRounds, RoundTimeout
from kubeddp.trainer.launcher.rendezvous import (
    NodeFlags,
    RendezvousError,
    RendezvousPlan,
    plan_from_env,
)
from kubeddp.trainer.launcher.retry_budget import RetryBudget, write_termination_message
from kubeddp.trainer.launcher.stall_watch import StallWatch, start_diagnostics
from kubeddp.trainer.launcher.torch_check import installed_torch_problem
from kubeddp.trainer.launcher.torchrun_cli import spellings
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


def node_flags(args: argparse.Namespace) -> NodeFlags:
    return NodeFlags(
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
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
    note = (lambda text: _log(f"[kubeddp] {text}")) if args.dry_run else None
    no_python = getattr(args, "no_python", False)  # kubeddp train's torchrun --no-python
    program = program_from_options(args.script, args.module, after_dash, note, no_python)
    if program is None:
        options, worker_args = config_options(args, after_dash)
        return options, None, worker_args
    option = "--script" if args.script is not None else "--module"
    check_overrides(args.overrides, option)
    check_config_file(args.config or os.environ.get(constants.ENV_CONFIG), option)
    options = argparse.Namespace(config=args.config, overrides=list(args.overrides))
    return options, program, torchrun_worker_args(program)


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
    own, after_dash = _split_worker_args(argv)
    return launch_with(launch_parser().parse_args(own), after_dash)


@dataclass
class LaunchPlan:
    """What launch will do, decided before anything is touched (all a dry run prints)."""

    rdzv: RendezvousPlan
    options: argparse.Namespace  # --config/--set, for the built-in trainer or the runner
    program: Program | None  # None: the built-in trainer
    spawns: bool  # the program starts its own workers (mp.spawn): it runs once per node


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
        print(launch_plan.rdzv.to_json())
        return 0
    try:
        cfg, deadline = preflight(args, launch_plan, env)
        return run_launch(launch_plan, cfg, deadline, env)
    except (ConfigError, RendezvousError, scratch.ScratchError) as exc:
        return _bad_input(exc)


def _bad_input(problem: object) -> int:
    _log(command_name.error(problem))
    return exit_codes.BAD_INPUT


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


def preflight(
    args: argparse.Namespace, launch_plan: LaunchPlan, env: Mapping[str, str]
) -> tuple[Config, float]:
    """The config and the rendezvous wait, checked before any wait or process starts; raises
    ConfigError, RendezvousError or ScratchError."""
    # Loaded here, not in each worker: a typo is one line now, not a traceback per worker.
    cfg = load_config_options(launch_plan.options, env)
    problem = _compile_problem(cfg.train, cfg.ddp) if launch_plan.program is None else None
    if problem:
        raise ConfigError(problem)
    # launch's agent and its workers write to /tmp: read-only or full, each worker would fail
    problem = scratch.problem() if launch_plan.rdzv.source != "torchrun" else None
    if problem:
        raise scratch.ScratchError(problem)
    return cfg, _rdzv_deadline(args.rdzv_wait, env)


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


def run_launch(
    launch_plan: LaunchPlan, cfg: Config, deadline: float, env: Mapping[str, str]
) -> int:
    """Say the plan, then run: in this process under a user's torchrun, else torchrun's agent
    in this pod (behind the checkpoint keeper, when there is one)."""
    plan, program = launch_plan.rdzv, launch_plan.program
    _say_plan(launch_plan)
    if plan.source == "torchrun":  # this process is already one of torchrun's workers
        return _run_as_torchrun_worker(program, cfg)
    try:  # before the budget: the keeper holds the budget's record and the checkpoints
        sync = checkpoint_sync.start_from_env(env, cfg.checkpoint.dir, deadline, _log)
        program_workdir(program, cfg.checkpoint.dir, env)
    except (checkpoint_sync.KeeperError, checkpoint_sync.KeeperSettingError, OSError) as exc:
        return _keeper_failed(exc)
    identity = _run_identity(launch_plan, cfg.to_dict(), cfg.checkpoint.resume)
    try:
        already = finished_run.finished_line(cfg.checkpoint.dir, identity) if identity else None
        if already:
            _log(already)
            return exit_codes.OK
        # a pod rejoining fetches again after a dropped connection, as a starting pod does
        within = checkpoint_sync.within
        refresh = (
            functools.partial(within, deadline, _log, sync.refresh) if sync is not None else None
        )
        code = _run_pod(plan, cfg, deadline, launch_plan.spawns, refresh)
        if identity and code == exit_codes.OK:  # sent to the keeper with the last files
            finished_run.record_finished(cfg.checkpoint.dir, identity)
        return code
    finally:
        if sync is not None:  # the workers have exited: their last files go to the keeper
            sync.finish(checkpoint_sync.FINISH_SECONDS)


def _run_identity(launch_plan: LaunchPlan, config: dict, resume: str) -> str | None:
    """The run's identity for finished_run (`config`: Config.to_dict(), `resume`: its
    checkpoint.resume), in a Kubernetes pod that resumes; else None."""
    plan, program = launch_plan.rdzv, launch_plan.program
    if not plan.in_kubernetes or resume == "never":
        return None
    command = program_fingerprint(program) if program is not None else ""
    return finished_run.run_identity(config, command, plan.nnodes, plan.nproc_per_node)


def _say_plan(launch_plan: LaunchPlan) -> None:
    plan, program = launch_plan.rdzv, launch_plan.program
    _log(
        f"[kubeddp] rendezvous: {plan.source}, nodes {plan.nnodes}, {plan.nproc_per_node} "
        f"workers/node, endpoint {plan.rdzv_endpoint} ({plan.rdzv_backend})"
    )
    if program is not None:
        _log(f"[kubeddp] program: {program.command_line()}")
    if launch_plan.spawns:
        _log("[kubeddp] the program starts its own workers (mp.spawn/mp.Process): it runs once")


def _run_as_torchrun_worker(program: Program | None, cfg: Config) -> int:
    if program is not None:
        from kubeddp.trainer.worker.program import run_program

        os.environ.update(resolved_config_env(cfg))  # the runner reads the SIGTERM grace
        return run_program(program)
    from kubeddp.trainer.worker.entry import run

    return run(cfg)


def _keeper_failed(exc: Exception) -> int:
    """The keeper's pod not up yet is retried (>= 128); a bad setting or dir is not."""
    code = exit_codes.STORAGE_UNREACHABLE
    if not isinstance(exc, checkpoint_sync.KeeperError):
        code = exit_codes.BAD_INPUT
    _log(command_name.error(f"{exc}; exit code {exit_codes.describe(code)}"))
    write_termination_message(str(exc))
    return code


def _run_pod(
    plan: RendezvousPlan,
    cfg: Config,
    deadline: float,
    spawns: bool,
    refresh: Callable[[], object] | None = None,
) -> int:
    """The retry budget, the rendezvous host, /metrics, then training."""
    # Only an operator restarts a pod; on a laptop or bare host every run is the user's own.
    limit = cfg.retries.without_progress if plan.in_kubernetes else 0
    budget = RetryBudget(cfg.checkpoint.dir, limit)
    refusal = budget.start()
    if refusal:
        _log(command_name.error(refusal))
        write_termination_message(refusal)
        return exit_codes.RETRIES_EXHAUSTED
    try:
        wait_for_rendezvous_host(plan, deadline, _log)
    except RendezvousHostUnreachable as exc:
        return _ended(budget, Outcome(exit_codes.RDZV_UNREACHABLE, reason=str(exc)))
    try:
        # Several nodes outside Kubernetes may share this host: a busy port is then expected.
        shared_host = not plan.in_kubernetes and plan.nnodes != "1"
        metrics = start_for_launch(cfg.metrics, plan.in_kubernetes, _log, shared_host)
    except MetricsSetupError as exc:
        _log(command_name.error(exc))
        budget.ended(exit_codes.BAD_INPUT, str(exc))
        return exit_codes.BAD_INPUT
    outcome = Outcome(exit_codes.TRAINING_FAILED)
    watch = start_diagnostics(cfg.diagnostics, cfg.checkpoint.dir, metrics, _log)
    try:
        if end_signals.pending_code() is not None:  # a signal that torch's imports swallowed
            raise end_signals.Terminated(end_signals.RECEIVED[0])
        worker_env = _worker_env(resolved_config_env(cfg), spawns, watch.env if watch else {})
        grace, rejoin = cfg.checkpoint.preempt_grace_seconds, cfg.retries.rejoin
        outcome = _train(plan, worker_env, deadline, budget, grace, rejoin, refresh)
    except Exception as exc:  # a signal just after the agent returned (its handler stays)
        signalled = end_signals.exit_code_of(exc)
        if signalled is None:
            raise
        outcome = Outcome(signalled, reason=f"stopped by a signal: exit code {signalled}")
    finally:
        outcome = _stop_watching(watch, metrics, outcome)
    return _ended(budget, outcome)


def _stop_watching(
    watch: StallWatch | None, metrics: PodMetricsEndpoint | None, outcome: Outcome
) -> Outcome:
    """End the stall watch and /metrics; the outcome is the watch's when it stopped the
    workers."""
    if watch is not None:
        code = watch.finish(outcome.code)
        if code != outcome.code:  # the stall watch stopped the workers: its line is why
            outcome = Outcome(code, reason=watch.termination_line())
    if metrics is not None:
        metrics.finish(outcome.code, _log)
    if watch is not None:
        watch.remove()  # after the metrics' linger: its last scrapes still read the records
    return outcome


def _ended(budget: RetryBudget, outcome: Outcome) -> int:
    """Record how the run ended; a failure's one line becomes the pod's termination message."""
    if outcome.code == exit_codes.RDZV_UNREACHABLE:
        code = exit_codes.describe(outcome.code)
        _log(command_name.error(f"{outcome.reason}; exit code {code}"))
    elif outcome.code == exit_codes.RETRIES_EXHAUSTED:
        _log(command_name.error(outcome.reason))
    if outcome.code != exit_codes.RETRIES_EXHAUSTED:
        budget.ended(outcome.code, outcome.reason)
    if outcome.code != exit_codes.OK:
        write_termination_message(
            outcome.reason or f"exit code {exit_codes.describe(outcome.code)}"
        )
    return outcome.code


def _rejoins(plan: RendezvousPlan) -> bool:
    """Several nodes: a pod whose peer was lost stays up and rejoins instead of failing."""
    return not plan.standalone and plan.nnodes != "1"


def _worker_env(
    config_env: Mapping[str, str], spawns: bool, diagnostics_env: Mapping[str, str] | None
) -> dict[str, str]:
    """What the workers' environment adds: the resolved config (`config_env`), the stall
    watch's settings and whether the program spawns its own workers."""
    env = {**config_env, **(diagnostics_env or {})}
    if spawns:
        env[constants.ENV_SPAWNS_WORKERS] = "1"  # the runner hides torchrun's ranks
    return env


def _train(
    plan: RendezvousPlan,
    worker_env: Mapping[str, str],
    deadline: float,
    budget: RetryBudget,
    grace: float,
    rejoin: bool,
    refresh: Callable[[], object] | None = None,
) -> Outcome:
    """torchrun's agent; while only a peer in another pod failed, this pod rejoins the next
    rendezvous instead of exiting. Its own pod is not recreated then, and the Job controller
    sees one failed pod (the lost one), not N: one pod start instead of N failures and an
    exponential recreation delay (10 s doubling to 6 min) that ignored failures still grow."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    # grace: checkpoint.preempt_grace_seconds; rejoin: retries.rejoin
    rounds = RendezvousRounds(plan, deadline) if rejoin and RendezvousRounds.applies(plan) else None

    def agent() -> Outcome:
        rdzv_round = rounds.next_round(_log) if rounds is not None else None
        return run_agent(plan, worker_env, grace, rdzv_round)

    try:
        outcome = agent()
        while outcome.rejoin and rejoin and _rejoins(plan):
            budget.ended(outcome.code, outcome.reason)
            refusal = budget.start()
            if refusal:
                return Outcome(exit_codes.RETRIES_EXHAUSTED, reason=refusal)
            _log(
                f"[kubeddp] a peer was lost ({outcome.reason}): this pod stays up and rejoins "
                f"the rendezvous ({budget.restarts_left()} restarts left without progress)"
            )
            wait_for_rendezvous_host(plan, deadline, _log)
            if refresh is not None:  # the keeper's newest files, as a recreated pod gets them
                refresh()
            outcome = agent()
    except (RendezvousHostUnreachable, RoundTimeout) as exc:
        return Outcome(exit_codes.RDZV_UNREACHABLE, reason=str(exc))
    except checkpoint_sync.KeeperError as exc:  # the keeper went away between two rounds
        return Outcome(exit_codes.STORAGE_UNREACHABLE, reason=str(exc))
    except SignalException as exc:  # torch's handlers stay installed between two runs
        code = 128 + int(exc.sigval)
        return Outcome(code, reason=f"stopped by signal {int(exc.sigval)}: exit code {code}")
    return outcome


def program_workdir(program: Program | None, checkpoint_dir: str, env: Mapping[str, str]) -> None:
    """A user's program starts in checkpoint.dir (`checkpoint_dir`) when the manifest asks (the
    chart does), so a relative `snapshot.pt` lands on the durable checkpoint storage."""
    if program is None or env.get(constants.ENV_PROGRAM_IN_CHECKPOINT_DIR) != "1":
        return
    if program.mode == "script" and not os.path.isabs(program.target):
        return  # a relative script path would no longer be found
    os.makedirs(checkpoint_dir, exist_ok=True)
    os.chdir(checkpoint_dir)
    _log(f"[kubeddp] program runs in {checkpoint_dir} (relative paths land there)")


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
    from kubeddp.trainer.launcher.script_check import warnings_for

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
