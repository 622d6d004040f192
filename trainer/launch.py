"""`kubeddp launch` (the image entrypoint) and `kubeddp train` (the laptop shorthand).

env -> RendezvousPlan -> wait for the rendezvous host -> torchrun's elastic agent, in process.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from collections.abc import Mapping

from kubeddp.trainer import constants
from kubeddp.trainer.config import ConfigError, load_config
from kubeddp.trainer.cpus import available_cpus, threads_per_worker
from kubeddp.trainer.metrics_server import MetricsSetupError, start_for_launch
from kubeddp.trainer.rendezvous import RendezvousError, RendezvousPlan, plan_from_env
from kubeddp.trainer.wait import RendezvousHostUnreachable, wait_for_host

DEFAULT_RDZV_WAIT_SECONDS = 600.0
# Seconds the agent waits for preempted workers beyond their own save budget (exit, flush).
SHUTDOWN_MARGIN_SECONDS = 10


def _split_worker_args(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _is_local_address(host: str) -> bool:
    """True when `host` resolves to an address of this machine/pod (we host the store)."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return True
            except OSError:
                continue
    return False


def _wait(plan: RendezvousPlan, deadline: float) -> None:
    if not plan.wait_for_host:
        return
    # The store's host only needs its own name to resolve; everyone else needs the port open.
    hosts_store = plan.node_rank == 0 if plan.rdzv_backend == "static" else None
    if hosts_store is None:
        wait_for_host(plan.host, plan.port, deadline, check_port=False, log=_log)
        hosts_store = _is_local_address(plan.host)
    wait_for_host(plan.host, plan.port, deadline, check_port=not hosts_store, log=_log)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _exit_code_of_failure(exc: BaseException) -> int:
    failures = getattr(exc, "failures", {}) or {}
    codes = [getattr(f, "exitcode", 1) for f in failures.values()]
    if constants.PREEMPTED_EXIT_CODE in codes:
        return constants.PREEMPTED_EXIT_CODE
    positive = [c for c in codes if c and c > 0]
    return positive[0] if positive else 1


def preempt_grace_seconds(worker_args: list[str]) -> float:
    """checkpoint.preempt_grace_seconds of the workers' config (default if it does not load)."""
    from kubeddp.trainer.config import ConfigError, load_config
    from kubeddp.trainer.worker import parse_args

    try:
        args = parse_args(worker_args)
        return load_config(args.config, args.overrides).checkpoint.preempt_grace_seconds
    except (ConfigError, SystemExit):  # the worker reports a bad config itself, in one line
        return float(constants.PREEMPT_GRACE_SECONDS)


def shutdown_timeout_env(preempt_grace: float | None = None) -> dict[str, str]:
    """TORCH_ELASTIC_SHUTDOWN_TIMEOUT sized to the preemption save, unless the user set one.

    On SIGTERM the agent gives workers this long before SIGKILL: the save (bounded by the
    workers' own grace timer) must fit in it. An environment variable rather than torchrun's
    --shutdown-timeout flag, which only some torch versions have; torch versions without the
    setting keep their fixed 30 s.
    """
    if "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in os.environ or os.environ.get("PET_SHUTDOWN_TIMEOUT"):
        return {}
    grace = constants.PREEMPT_GRACE_SECONDS if preempt_grace is None else preempt_grace
    return {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(math.ceil(grace) + SHUTDOWN_MARGIN_SECONDS)}


def torchrun_args(plan: RendezvousPlan) -> argparse.Namespace:
    """torchrun's parsed arguments for the plan (the installed torch's own parser)."""
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(plan.argv[1:])


def run_torchrun(plan: RendezvousPlan, preempt_grace: float | None = None) -> int:
    """Run torchrun's elastic agent in this process (no extra exec, signals reach it)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    os.environ["KUBEDDP_RDZV_SOURCE"] = plan.source  # shown in kubeddp_info
    # torch shares the rendezvous TCPStore with the workers by default, and a restarted worker
    # group then reads the previous group's keys (gloo/NCCL connect to dead ports: pytorch
    # issue 135712). A store per worker group makes --max-restarts work.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if "OMP_NUM_THREADS" not in os.environ and plan.nproc_per_node > 1:
        threads = threads_per_worker(plan.nproc_per_node, available_cpus())
        os.environ["OMP_NUM_THREADS"] = str(threads)  # torchrun would set 1 (and warn)
    os.environ.update(shutdown_timeout_env(preempt_grace))
    args = torchrun_args(plan)
    try:
        run(args)
    except ChildFailedError as exc:
        code = _exit_code_of_failure(exc)
        _log(f"[kubeddp] training failed (worker exit code {code}); see the worker output above")
        return code
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


def launch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubeddp launch",
        description="Start DDP training from whatever launched this process (torchrun, "
        "PyTorchJob, elastic PyTorchJob, TrainJob, Indexed Job, plain env, or nothing). "
        "Arguments after -- go to every worker (--config FILE, --set section.key=value).",
    )
    p.add_argument(
        "--nproc-per-node",
        default=None,
        help="workers on this node: N, auto, gpu or cpu (default: from the env, "
        "else one per visible GPU, else $KUBEDDP_CPU_NPROC or 1)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        help="torchrun worker-group restarts before failing",
    )
    p.add_argument(
        "--rdzv-wait",
        type=float,
        default=None,
        help="seconds to wait for the rendezvous host's DNS name and port "
        f"(default ${constants.ENV_RDZV_WAIT_SECONDS} or 600)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan as JSON and exit")
    return p


def _env_number(env: Mapping[str, str], name: str, kind: type, default: float = 0) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise RendezvousError(f"{name}={raw!r} is not a number; set a number or unset it") from None


def _check_worker_config(worker_args: list[str]) -> None:
    """Load the workers' config here: one line now, not one traceback per worker later."""
    from kubeddp.trainer.worker import parse_args

    args = parse_args(worker_args)  # an unknown worker flag exits 2 with argparse's usage line
    load_config(args.config, args.overrides)


def launch_main(argv: list[str]) -> int:
    own, worker_args = _split_worker_args(argv)
    args = launch_parser().parse_args(own)
    env = os.environ
    try:
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
        )
    except RendezvousError as exc:
        _log(f"kubeddp launch: error: {exc}")
        return 2
    if args.dry_run:
        print(plan.to_json())
        return 0
    try:
        _check_worker_config(worker_args)
        deadline = args.rdzv_wait
        if deadline is None:
            deadline = _env_number(
                env, constants.ENV_RDZV_WAIT_SECONDS, float, DEFAULT_RDZV_WAIT_SECONDS
            )
    except (ConfigError, RendezvousError) as exc:
        _log(f"kubeddp launch: error: {exc}")
        return 2
    _log(
        f"[kubeddp] rendezvous: {plan.source}, nodes {plan.nnodes}, {plan.nproc_per_node} "
        f"workers/node, endpoint {plan.rdzv_endpoint} ({plan.rdzv_backend})"
    )
    if plan.source == "torchrun":
        from kubeddp.trainer.worker import main as worker_main

        return worker_main(worker_args)
    try:
        _wait(plan, deadline)
    except RendezvousHostUnreachable as exc:
        _log(f"kubeddp launch: error: {exc}")
        return 3
    try:
        metrics = start_for_launch(worker_args, plan.in_kubernetes, _log)
    except MetricsSetupError as exc:
        _log(f"kubeddp launch: error: {exc}")
        return 2
    code = 1
    try:
        code = run_torchrun(plan, preempt_grace_seconds(worker_args))
    finally:
        if metrics is not None:
            metrics.finish(code, _log)
    return code


def train_main(argv: list[str]) -> int:
    """`kubeddp train --nproc 2 [--config F] [--set k=v ...]`: launch with trainer args inline."""
    p = argparse.ArgumentParser(prog="kubeddp train", description="train on this machine")
    p.add_argument("--nproc", default=None, help="worker processes (default: GPUs, else 1)")
    p.add_argument("--max-restarts", type=int, default=None)
    p.add_argument("--config", default=None)
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE"
    )
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    launch_args = []
    if args.nproc:
        launch_args += ["--nproc-per-node", str(args.nproc)]
    if args.max_restarts is not None:
        launch_args += ["--max-restarts", str(args.max_restarts)]
    if args.dry_run:
        launch_args.append("--dry-run")
    worker_args = ["--config", args.config] if args.config else []
    for item in args.overrides:
        worker_args += ["--set", item]
    return launch_main([*launch_args, "--", *worker_args])
