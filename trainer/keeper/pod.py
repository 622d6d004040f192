"""The checkpoint keeper's part of launch: which pods read checkpoints, the start (wait, fill,
sync thread) and the end (the last send, and the exit code when it failed).

Who fetches a checkpoint: the built-in trainer reads it on rank 0 and broadcasts it, so only
the pod of global rank 0 fetches it (node rank 0 of a static rendezvous); a user's program gets
it in every pod unless `checkpoint.readers=rank0` says rank 0 reads it. In an elastic job the
node ranks are given at rendezvous, after the fetch, so every pod fetches the newest one.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

from kubeddp.trainer import exit_codes
from kubeddp.trainer.config import CheckpointConfig
from kubeddp.trainer.keeper import sizing as keeper_sizing
from kubeddp.trainer.keeper import sync as checkpoint_sync
from kubeddp.trainer.keeper.client import KeeperAuthError, KeeperError, KeeperSettingError
from kubeddp.trainer.keeper.reach import KeeperGaveUp
from kubeddp.trainer.launcher import command_name
from kubeddp.trainer.launcher.rendezvous_plan import RendezvousPlan
from kubeddp.trainer.launcher.retry_budget import write_termination_message

START_ERRORS = (KeeperError, KeeperSettingError, KeeperGaveUp, OSError)
SIGNALLED = (exit_codes.PREEMPTED, exit_codes.INTERRUPTED)
Log = Callable[[str], None]


def reads_checkpoints(plan: RendezvousPlan, program_runs: bool, readers: str) -> bool:
    """Whether this pod fetches checkpoints (`program_runs`: a user's program, not the
    built-in trainer; `readers`: checkpoint.readers)."""
    if plan.standalone or plan.nnodes == "1" or plan.rdzv_backend != "static":
        return True  # one pod, or an elastic job: any pod may host rank 0
    if program_runs and readers == "all":
        return True
    return plan.node_rank == 0


def start(
    env: Mapping[str, str],
    checkpoint: CheckpointConfig,
    retry_limit: int,
    plan: RendezvousPlan,
    program_runs: bool,
    deadline: float,
    log: Log,
) -> checkpoint_sync.CheckpointSync | None:
    """None without a keeper; else checkpoint.dir filled and the sync thread on. Raises
    START_ERRORS (start_failed gives the exit code)."""
    settings = checkpoint_sync.SyncSettings(
        reads=reads_checkpoints(plan, program_runs, checkpoint.readers),
        keep=checkpoint.keep,
        pod=socket.gethostname(),
    )
    limit = retry_limit if plan.in_kubernetes else 0
    return checkpoint_sync.start_from_env(env, checkpoint.dir, deadline, log, settings, limit)


def start_failed(exc: BaseException, log: Log) -> int:
    """A keeper that did not answer within the pod's whole wait ends the job (7; with no retry
    limit, one wait is retried: 202); a bad setting, secret or directory is fatal (2)."""
    code = exit_codes.STORAGE_UNREACHABLE
    if isinstance(exc, KeeperGaveUp):
        code = exit_codes.KEEPER_UNREACHABLE
    elif isinstance(exc, KeeperAuthError) or not isinstance(exc, KeeperError):
        code = exit_codes.BAD_INPUT
    log(command_name.error(f"{exc}; exit code {exit_codes.describe(code)}"))
    write_termination_message(str(exc))
    return code


def finish(
    sync: checkpoint_sync.CheckpointSync,
    env: Mapping[str, str],
    preempt_grace: float,
    code: int,
    log: Log,
) -> int:
    """Send the last files within what the grace period allows; the pod's exit code: `code`,
    or CHECKPOINT_NOT_KEPT (retried) when a finished run's last files are not on the keeper."""
    seconds = keeper_sizing.send_seconds(
        env, preempt_grace, code in SIGNALLED, sync.pending_bytes()
    )
    kept = sync.finish(seconds)
    sync.client.close()
    if kept or code != exit_codes.OK:
        return code
    not_kept = exit_codes.CHECKPOINT_NOT_KEPT
    line = (
        f"the last checkpoint or files did not reach the checkpoint keeper {sync.client.url} "
        f"within {seconds:.0f} s; exit code {exit_codes.describe(not_kept)}: the next pod "
        "resumes from the keeper's newest checkpoint"
    )
    log(command_name.error(line))
    write_termination_message(line)
    return not_kept
