"""`kubeddp launch` (the image entrypoint) and `kubeddp train` (the laptop shorthand).

env -> RendezvousPlan -> wait for the rendezvous host -> torchrun's elastic agent, in process.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from kubeddp.trainer import constants
from kubeddp.trainer.rendezvous import RendezvousError, RendezvousPlan, plan_from_env
from kubeddp.trainer.wait import RendezvousHostUnreachable, wait_for_host

DEFAULT_RDZV_WAIT_SECONDS = 600.0


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


def run_torchrun(plan: RendezvousPlan) -> int:
    """Run torchrun's elastic agent in this process (no extra exec, signals reach it)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ["KUBEDDP_RDZV_SOURCE"] = plan.source  # shown in kubeddp_info
    args = get_args_parser().parse_args(plan.argv[1:])
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


def launch_main(argv: list[str]) -> int:
    own, worker_args = _split_worker_args(argv)
    args = launch_parser().parse_args(own)
    env = os.environ
    try:
        gpus = (
            _gpu_count
            if not args.dry_run or env.get("KUBEDDP_DRY_RUN_GPUS") is None
            else (lambda: int(env["KUBEDDP_DRY_RUN_GPUS"]))
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
    _log(
        f"[kubeddp] rendezvous: {plan.source}, nodes {plan.nnodes}, {plan.nproc_per_node} "
        f"workers/node, endpoint {plan.rdzv_endpoint} ({plan.rdzv_backend})"
    )
    if plan.source == "torchrun":
        from kubeddp.trainer.worker import main as worker_main

        return worker_main(worker_args)
    deadline = args.rdzv_wait
    if deadline is None:
        deadline = float(env.get(constants.ENV_RDZV_WAIT_SECONDS, DEFAULT_RDZV_WAIT_SECONDS))
    try:
        _wait(plan, deadline)
    except RendezvousHostUnreachable as exc:
        _log(f"kubeddp launch: error: {exc}")
        return 3
    return run_torchrun(plan)


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
