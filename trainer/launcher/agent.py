"""torchrun's elastic agent, run in the launch process: its command line, its environment and
the exit code of a failed worker group."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kubeddp.trainer import constants, exit_codes, process_contract
from kubeddp.trainer.common import one_line
from kubeddp.trainer.launcher import command_name, scratch
from kubeddp.trainer.launcher.cpus import available_cpus, threads_per_worker

if TYPE_CHECKING:
    from kubeddp.trainer.launcher.rendezvous_plan import RendezvousPlan

# Imported in functions: torch.distributed (torchrun's agent): `kubeddp train --help` imports this
# module and must not import torch (tests/unit/test_torchrun_args.py).

WORKER_MODULE = "kubeddp.trainer.worker"
# Seconds the agent waits for preempted workers beyond their own save budget (exit, flush).
SHUTDOWN_MARGIN_SECONDS = 10


def torchrun_argv(
    plan: RendezvousPlan, worker_args: list[str], worker_module: str = WORKER_MODULE
) -> list[str]:
    """The torchrun command line the plan stands for (launch runs it in process); each worker
    runs `python -m worker_module worker_args` (the built-in trainer, or the runner of a
    user's own program)."""
    args = ["torchrun", f"--nproc-per-node={plan.nproc_per_node}"]
    if plan.standalone:
        # One node: keep the store on loopback, so a host name that does not resolve
        # (`docker run --network none`) cannot stall the rendezvous.
        args += ["--standalone", "--local-addr=127.0.0.1"]
    elif plan.rdzv_backend == "static":
        args += [
            f"--nnodes={plan.nnodes}",
            f"--node-rank={plan.node_rank}",
            f"--master-addr={plan.host}",
            f"--master-port={plan.port}",
        ]
    else:
        args += [
            f"--nnodes={plan.nnodes}",
            f"--rdzv-backend={plan.rdzv_backend}",
            f"--rdzv-endpoint={plan.rdzv_endpoint}",
            f"--rdzv-id={plan.rdzv_id}",
        ]
        if plan.rdzv_conf:
            args.append(f"--rdzv-conf={plan.rdzv_conf}")
    args.append(f"--max-restarts={plan.max_restarts}")
    return [*args, "--module", worker_module, *worker_args]


def torchrun_args(plan: RendezvousPlan) -> argparse.Namespace:
    """torchrun's parsed arguments for the plan (the installed torch's own parser). The
    workers' arguments are set, not parsed: argparse would read a program's `--log 5` as an
    abbreviation of torchrun's --log-dir (and refuse it as ambiguous)."""
    from torch.distributed.run import get_args_parser

    cut = plan.argv.index("--module") + 2  # up to the worker module, which torchrun runs
    args = get_args_parser().parse_args(plan.argv[1:cut])
    args.training_script_args = plan.argv[cut:]
    return args


def shutdown_timeout_env(preempt_grace: float) -> dict[str, str]:
    """TORCH_ELASTIC_SHUTDOWN_TIMEOUT sized to the preemption save, unless the user set one.

    On SIGTERM the agent gives workers this long before SIGKILL: the save (bounded by the
    workers' own grace timer) must fit in it. An environment variable rather than torchrun's
    --shutdown-timeout flag, which only some torch versions have; torch versions without the
    setting keep their fixed 30 s.
    """
    if "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in os.environ or os.environ.get("PET_SHUTDOWN_TIMEOUT"):
        return {}
    return {
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(math.ceil(preempt_grace) + SHUTDOWN_MARGIN_SECONDS)
    }


def shutdown_seconds(preempt_grace: float) -> float:
    """How long stopped workers get before SIGKILL: the user's setting of the agent's shutdown
    timeout, else the one shutdown_timeout_env gives it."""
    for name in ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT"):
        try:
            return float(os.environ[name])
        except (KeyError, ValueError):
            continue
    return math.ceil(preempt_grace) + SHUTDOWN_MARGIN_SECONDS


def worker_exit_code(exitcode: int) -> int:
    """A worker's exit code as the table names it (exit_codes.py): torch reports a death by
    signal N as -N, which is KILLED, PREEMPTED or INTERRUPTED for their signals and CRASHED for
    any other (SIGABRT, SIGSEGV...: a shell would show 128 + N, a code no row names)."""
    return exit_codes.for_signal(-exitcode) if exitcode < 0 else exit_codes.documented(exitcode)


# What torch's agent does to the other workers once one failed (SIGTERM, then SIGKILL after the
# shutdown timeout): they are reported as failed too, but they are the consequence, not the cause.
STOPPED_BY_AGENT = (exit_codes.PREEMPTED, exit_codes.KILLED)
# The agent sends SIGKILL no sooner than this after the first failure (the shutdown timeout is
# the save grace + SHUTDOWN_MARGIN_SECONDS, or torch's fixed 30 s): a worker SIGKILLed earlier
# was killed by the kernel (out of memory), and that is the pod's own failure.
AGENT_SIGKILL_AFTER_SECONDS = SHUTDOWN_MARGIN_SECONDS
# A worker group that ended with these, while this process got no signal, lost a peer in another
# pod: the pod itself is healthy (a preemption vote saved and stopped it, or a collective failed).
REJOIN_CODES = (exit_codes.PEER_FAILED, exit_codes.PREEMPTED)


def _is_cause(code: int, seconds_after_first: float) -> bool:
    if code == exit_codes.PREEMPTED:
        return False  # SIGTERM comes from the agent, or the preemption vote
    if code == exit_codes.KILLED:
        return seconds_after_first < AGENT_SIGKILL_AFTER_SECONDS
    return True


def exit_code_of_failure(exc: BaseException, stopped_at: float | None = None) -> int:
    """One exit code for the pod from its failed workers (torch's ChildFailedError).

    The operators decide from this code alone, so the cause must win over its consequences:
    - SIGTERM codes, and SIGKILL codes that come the shutdown timeout after the first failure,
      are the agent stopping the rest: they count only when nothing else is there;
    - a worker's own code wins over PEER_FAILED: a worker the kernel killed (OOM, 137, before
      the agent could have), a crash by another signal (SIGSEGV 139, SIGABRT 134), or a
      failure of its own (fatal, 1-127; retrying would fail the same way, and ExitCode
      recreations never count against backoffLimit) makes its local peers' collectives fail
      too, and it is what the pod must report: a deterministic OOM is not a peer failure;
    - PEER_FAILED when that is all: another pod failed;
    - a failure from `stopped_at` on (time.time()) is the round watch stopping the workers
      (round_watch.py): a consequence, and PEER_FAILED when nothing failed before it.
    Among the causes the earliest failure wins (torch's timestamp), then the lowest rank.
    """
    failures = getattr(exc, "failures", {}) or {}
    ordered = sorted(failures.items(), key=lambda item: (getattr(item[1], "timestamp", 0), item[0]))
    timed = [
        (worker_exit_code(int(getattr(f, "exitcode", 1))), float(getattr(f, "timestamp", 0)))
        for _, f in ordered
    ]
    timed = [(code, stamp) for code, stamp in timed if code != exit_codes.OK]
    if not timed:
        return exit_codes.TRAINING_FAILED
    first = timed[0][1]
    codes = [code for code, _ in timed]
    # torch's timestamps are whole seconds: one in the second of the stop counts as stopped
    stop = math.floor(stopped_at) if stopped_at is not None else math.inf
    causes = [code for code, stamp in timed if _is_cause(code, stamp - first) and stamp < stop]
    if not causes and stopped_at is not None:
        return exit_codes.PEER_FAILED
    if not causes:  # stopped by a signal only: preempted (a vote, or SIGTERM), or killed
        return exit_codes.PREEMPTED if exit_codes.PREEMPTED in codes else codes[0]
    own = [code for code in causes if code != exit_codes.PEER_FAILED]
    return own[0] if own else exit_codes.PEER_FAILED


@dataclass(frozen=True)
class Outcome:
    """How torchrun's agent ended: the pod's exit code, and whether the worker group failed
    only because a peer in another pod went away (this process got no signal)."""

    code: int
    rejoin: bool = False
    reason: str = ""


def first_failed(exc: BaseException, chosen: int | None = None) -> str:
    """`; local rank R (pid P) failed first (died by SIGABRT)`: the earliest worker that failed
    on its own (the others were stopped by the agent) with the pod's code (`chosen`) where one
    did, for the one line that says why the group ended."""
    failures = getattr(exc, "failures", {}) or {}
    ordered = sorted(failures.items(), key=lambda item: (getattr(item[1], "timestamp", 0), item[0]))
    codes = [worker_exit_code(int(getattr(f, "exitcode", 1))) for _, f in ordered]
    wanted = chosen if chosen in codes else None
    for (rank, failure), code in zip(ordered, codes, strict=True):
        if code != exit_codes.OK and code not in STOPPED_BY_AGENT and wanted in (None, code):
            pid = getattr(failure, "pid", None)
            raw = int(getattr(failure, "exitcode", 1))
            how = f"died by {signal_name(-raw)}" if raw < 0 else f"exited {raw}"
            return (
                f"; local rank {rank}" + (f" (pid {pid})" if pid else "") + f" failed first ({how})"
            )
    return ""


def signal_name(sigval: int) -> str:
    try:
        return signal.Signals(int(sigval)).name
    except ValueError:
        return f"signal {sigval}"


def run_agent(
    plan: RendezvousPlan,
    worker_env: dict[str, str],
    preempt_grace: float,
    rdzv_round: tuple[str, int] | None = None,
    stopped_at: Callable[[], float | None] | None = None,
) -> Outcome:
    """Run torchrun's elastic agent in this process (no extra exec, signals reach it), with
    `worker_env` added to the environment it passes on to every worker. `rdzv_round`: the
    rendezvous id and store port of a static round (rejoin.py); `stopped_at`: when the round's
    watch stopped the workers (round_watch.py), if it did.
    """
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import run

    _set_agent_env(plan, worker_env, preempt_grace)
    args = torchrun_args(plan)
    if rdzv_round is not None:
        args.rdzv_id, args.master_port = rdzv_round
    # torchrun's log dir (error files) under our scratch dir, not a torchelastic_* in /tmp
    # that nobody removes; a killed launch's is swept by the next.
    own_log_dir = None if args.log_dir else scratch.owned_dir(constants.RUN_DIR_PREFIX)
    if own_log_dir is not None:
        args.log_dir = str(own_log_dir)
    exited_dir = scratch.owned_dir(constants.RUN_DIR_PREFIX)
    os.environ[process_contract.ENV_EXITED_DIR] = str(exited_dir)  # workers note a return of 0
    try:
        run(args)
    except ChildFailedError as exc:
        return _group_failed(exc, exited_dir, stopped_at() if stopped_at else None)
    except SignalException as exc:
        code = exit_codes.for_signal(int(exc.sigval))
        _log(f"[kubeddp] {signal_name(exc.sigval)}: workers stopped; exit code "
             f"{exit_codes.describe(code)}")  # fmt: skip
        return Outcome(code, False, f"stopped by {signal_name(exc.sigval)}: exit code {code}")
    except (RendezvousError, DistError, ConnectionError, TimeoutError) as exc:
        # The agent's own store or rendezvous went away (the c10d host pod died, the network
        # dropped): nothing this pod did wrong.
        code = exit_codes.PEER_FAILED
        reason = f"rendezvous lost: {one_line(exc)}"
        _log(f"[kubeddp] {reason}; exit code {exit_codes.describe(code)}")
        return Outcome(code, True, reason)
    finally:
        if own_log_dir is not None:
            shutil.rmtree(own_log_dir, ignore_errors=True)
        shutil.rmtree(exited_dir, ignore_errors=True)
    return Outcome(exit_codes.OK)


def _set_agent_env(plan: RendezvousPlan, worker_env: dict[str, str], preempt_grace: float) -> None:
    """What the agent and every worker it starts read from this process's environment."""
    os.environ.update(worker_env)
    os.environ[process_contract.ENV_RDZV_SOURCE] = plan.source  # shown in kubeddp_info
    # torch shares the rendezvous TCPStore with the workers by default, and a worker group the
    # agent restarts (--max-restarts) then reads the previous group's keys (gloo/NCCL connect
    # to dead ports: pytorch issue 135712): with restarts, a store per worker group. Only then:
    # that store's port is picked free and bound seconds later by rank 0's worker, and an
    # outgoing connection can take it meanwhile (EADDRINUSE: a failed run, seen in e2e).
    if plan.max_restarts > 0:
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if "OMP_NUM_THREADS" not in os.environ and plan.nproc_per_node > 1:
        threads = threads_per_worker(plan.nproc_per_node, available_cpus())
        os.environ["OMP_NUM_THREADS"] = str(threads)  # torchrun would set 1 (and warn)
    os.environ.update(shutdown_timeout_env(preempt_grace))
    os.environ[process_contract.ENV_LAUNCHER_PID] = str(os.getpid())  # workers die with launch


def _group_failed(exc: BaseException, exited_dir: Path, stopped_at: float | None) -> Outcome:
    """The outcome of a worker group that failed, said in one line."""
    code = exit_code_of_failure(exc, stopped_at)
    early = _returned_early(exc, exited_dir) if code == exit_codes.PEER_FAILED else []
    if early:
        code = exit_codes.TRAINING_FAILED
        _log(command_name.error(
            f"rank {', '.join(map(str, early))} of the program returned (exit 0) while its "
            "peers still ran, so their collectives failed; end every rank together (the same "
            f"steps, then destroy_process_group): exit code {exit_codes.describe(code)}"
        ))  # fmt: skip
        return Outcome(code, False, f"rank {early[0]} returned early: exit code {code}")
    if stopped_at is not None and code == exit_codes.PEER_FAILED:  # the watch said why
        return Outcome(code, True, "a pod left the round: this pod's workers were stopped")
    reason = f"workers failed: exit code {exit_codes.describe(code)}"
    _log(f"[kubeddp] training failed (worker exit code {code}): exit code "
         f"{exit_codes.describe(code)}{first_failed(exc, code)}; see the worker output "
         "above")  # fmt: skip
    return Outcome(code, code in REJOIN_CODES, reason + first_failed(exc, code))


def _returned_early(exc: BaseException, exited_dir: Path) -> list[int]:
    """Ranks of this node that returned 0 before the group's first failure."""
    failures = getattr(exc, "failures", {}) or {}
    stamps = [float(getattr(f, "timestamp", 0) or 0) for f in failures.values()]
    return process_contract.returned_before(exited_dir, min(stamps)) if stamps else []


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
