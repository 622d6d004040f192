"""The pod's life once the plan stands: the checkpoint keeper's sync (start, finish), the
finished-run record, the retry budget, the rendezvous host, /metrics and the stall watch, then
torchrun's agent, rejoining the next rendezvous while only a peer in another pod failed.

Under a user's own torchrun this process is already one of its workers: it trains in process.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping

from kubeddp.trainer import constants, exit_codes, process_contract
from kubeddp.trainer.config import Config
from kubeddp.trainer.keeper import pod as keeper_pod
from kubeddp.trainer.keeper import sync as checkpoint_sync
from kubeddp.trainer.launcher import (
    command_name,
    end_signals,
    finished_run,
    snapshot_dir,
    trainjob_status,
)
from kubeddp.trainer.launcher.agent import Outcome, run_agent, shutdown_seconds
from kubeddp.trainer.launcher.launch_plan import LaunchPlan
from kubeddp.trainer.launcher.metrics_server import (
    MetricsSetupError,
    PodMetricsEndpoint,
    start_for_launch,
)
from kubeddp.trainer.launcher.program_options import program_fingerprint
from kubeddp.trainer.launcher.rejoin import RendezvousRounds, RoundTimeout
from kubeddp.trainer.launcher.rendezvous import RendezvousPlan
from kubeddp.trainer.launcher.retry_budget import RetryBudget, write_termination_message
from kubeddp.trainer.launcher.round_watch import RoundWatch
from kubeddp.trainer.launcher.stall_watch import StallWatch, start_diagnostics
from kubeddp.trainer.launcher.wait import RendezvousHostUnreachable, wait_for_rendezvous_host
from kubeddp.trainer.process_contract import resolved_config_env
from kubeddp.trainer.worker.program import Program, run_program

# Imported in functions: the worker (torch) and torch's elastic agent: `kubeddp train --help`
# imports this module and must not import torch (tests/unit/test_torchrun_args.py).


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
        sync = keeper_pod.start(env, cfg.checkpoint, cfg.retries.without_progress, plan,
                                program is not None, deadline, _log)  # fmt: skip
        program_workdir(program, cfg.checkpoint.dir, env)
    except keeper_pod.START_ERRORS as exc:
        return keeper_pod.start_failed(exc, _log)
    identity = _run_identity(launch_plan, cfg.to_dict(), cfg.checkpoint.resume)
    code = exit_codes.INTERNAL_ERROR  # until the pod's run says how it ended
    try:
        already = finished_run.finished_line(cfg.checkpoint.dir, identity) if identity else None
        if already:
            _log(already)
            code = exit_codes.OK
            return code
        # a pod rejoining fetches again after a dropped connection, as a starting pod does
        within = checkpoint_sync.within
        refresh = (
            functools.partial(within, deadline, _log, sync.refresh) if sync is not None else None
        )
        progress = sync.progress_ns if sync is not None else None
        code = _run_pod(plan, cfg, deadline, launch_plan.spawns, refresh, progress)
        if identity and code == exit_codes.OK:  # sent to the keeper after the last files
            finished_run.record_finished(cfg.checkpoint.dir, identity)
    finally:
        if sync is not None:  # the workers have exited: their last files go to the keeper
            code = keeper_pod.finish(sync, env, cfg.checkpoint.preempt_grace_seconds, code, _log)
        snapshot_dir.remove_when_done(cfg.checkpoint.dir, plan, env, code)
    return code


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
        os.environ.update(resolved_config_env(cfg))  # the runner reads the SIGTERM grace
        return run_program(program)
    from kubeddp.trainer.worker.entry import run

    return run(cfg)


def _run_pod(
    plan: RendezvousPlan,
    cfg: Config,
    deadline: float,
    spawns: bool,
    refresh: Callable[[], object] | None = None,
    progress: Callable[[], int] | None = None,
) -> int:
    """The retry budget, the rendezvous host, /metrics, then training (`progress`: the
    newest checkpoint's time where the keeper has it, for the budget)."""
    # Only an operator restarts a pod; on a laptop or bare host every run is the user's own.
    limit = cfg.retries.without_progress if plan.in_kubernetes else 0
    budget = RetryBudget(cfg.checkpoint.dir, limit, progress=progress)
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
    status = trainjob_status.start_for_launch(os.environ, _log)  # TrainJob progress
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
        if status is not None:
            status.stop()
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
    if process_contract.ENV_SAFE_PATH not in os.environ:  # the working directory off sys.path
        env |= {process_contract.ENV_SAFE_PATH: "1", process_contract.ENV_SAFE_PATH_ADDED: "1"}
    if spawns:
        env[process_contract.ENV_SPAWNS_WORKERS] = "1"  # the runner hides torchrun's ranks
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
        if rounds is None:
            return run_agent(plan, worker_env, grace)
        rdzv_round = rounds.next_round(_log)
        with RoundWatch(rounds, shutdown_seconds(grace), _log) as watch:
            return run_agent(plan, worker_env, grace, rdzv_round, lambda: watch.stopped_at)

    try:
        outcome = agent()
        while outcome.rejoin and rejoin and _rejoins(plan):
            budget.ended(outcome.code, outcome.reason)
            refusal = budget.start()
            if refusal:
                return Outcome(exit_codes.RETRIES_EXHAUSTED, reason=refusal)
            _say_rejoin(outcome, budget)
            wait_for_rendezvous_host(plan, deadline, _log)
            if refresh is not None:  # the keeper's newest files, as a recreated pod gets them
                refresh()
            os.environ[process_contract.ENV_REJOINED] = "1"  # the agent passes it on
            outcome = agent()
    except (RendezvousHostUnreachable, RoundTimeout) as exc:
        return Outcome(exit_codes.RDZV_UNREACHABLE, reason=str(exc))
    except checkpoint_sync.KeeperError as exc:  # the keeper went away between two rounds
        return Outcome(exit_codes.STORAGE_UNREACHABLE, reason=str(exc))
    except SignalException as exc:  # torch's handlers stay installed between two runs
        code = exit_codes.for_signal(int(exc.sigval))
        return Outcome(code, reason=f"stopped by signal {int(exc.sigval)}: exit code {code}")
    return outcome


def _say_rejoin(outcome: Outcome, budget: RetryBudget) -> None:
    left = f" ({budget.restarts_left()} restarts left without progress)" if budget.limit else ""
    _log(
        f"[kubeddp] a peer was lost ({outcome.reason}): this pod stays up and rejoins the "
        f"rendezvous{left}"
    )


def program_workdir(program: Program | None, checkpoint_dir: str, env: Mapping[str, str]) -> None:
    """A user's program starts in checkpoint.dir (`checkpoint_dir`) when the manifest asks (the
    chart does), so a relative `snapshot.pt` lands on the durable checkpoint storage."""
    if program is None or env.get(constants.ENV_PROGRAM_IN_CHECKPOINT_DIR) != "1":
        return
    if program.mode == "script" and not os.path.isabs(program.target):
        return  # a relative script path would no longer be found
    os.makedirs(checkpoint_dir, exist_ok=True)
    os.environ[process_contract.ENV_LAUNCH_DIR] = os.getcwd()  # where `--module` programs are found
    os.chdir(checkpoint_dir)
    _log(f"[kubeddp] program runs in {checkpoint_dir} (relative paths land there)")
