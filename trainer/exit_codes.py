"""Every exit code kubeddp ends with, and who retries it: one table for launch, train, the
worker, the user-script runner and the CLI (docs/exit-codes.md is generated from it).

The operators decide from the pod's exit code: PyTorchJob `restartPolicy: ExitCode` recreates
a pod only for codes >= 128, the Indexed Job's pod failure policy fails the job on 1-127, and
TrainJob/JobSet pods restart OnFailure up to the Job's backoffLimit. So a deterministic mistake
(bad config, bad env, a program that fails the same way every time) ends with a code below
128, and everything another pod, the node, the network or the rendezvous caused ends with a
code of 128 or more, retried and resumed from the newest checkpoint.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

RETRYABLE_FROM = 128  # PyTorchJob ExitCode: codes >= 128 are retried


@dataclass(frozen=True)
class ExitCode:
    code: int
    name: str
    where: str  # "training" (launch, train, the image, workers) | "cli" | "both"
    meaning: str
    action: str  # what the user (or the operator) does about it

    @property
    def retryable(self) -> bool:
        return self.code >= RETRYABLE_FROM


OK = 0
TRAINING_FAILED = 1
BAD_INPUT = 2
CLUSTER_ERROR = 3
INTERNAL_ERROR = 4
RETRIES_EXHAUSTED = 5
NONFINITE = 6
KEEPER_UNREACHABLE = 7
WAIT_TIMEOUT = 124
INTERRUPTED = 130
KILLED = 137
PREEMPTED = 143
RDZV_UNREACHABLE = 200
PEER_FAILED = 201
STORAGE_UNREACHABLE = 202
STALLED = 203
CHECKPOINT_NOT_KEPT = 204
CRASHED = 205

TABLE: tuple[ExitCode, ...] = (
    ExitCode(OK, "ok", "both", "finished; the CLI command did what was asked", "nothing"),
    ExitCode(
        TRAINING_FAILED,
        "failed",
        "both",
        "training: the program failed on its own (an exception of its own, an exit code it "
        "chose below 128, or any code outside 0-255); validate: problems found; check: pitfalls "
        "found in the script; wait: the job failed; any command: its output could not be "
        "written (a full disk, a closed pipe)",
        "fix the program or the manifest; a retry would fail the same way",
    ),
    ExitCode(
        BAD_INPUT,
        "bad input",
        "both",
        "a config key, flag, environment variable, file or name is wrong (one line says which)",
        "fix the input the message names",
    ),
    ExitCode(
        CLUSTER_ERROR,
        "cluster error",
        "cli",
        "the Kubernetes API could not be used: no or a broken kubeconfig, unreachable, timed "
        "out, refused, forbidden, not found, or an answer that is not the API's",
        "check the kubeconfig/context, RBAC and that the operator is installed",
    ),
    ExitCode(
        INTERNAL_ERROR,
        "internal error",
        "both",
        "a bug in kubeddp (the one line names the exception; KUBEDDP_DEBUG=1 shows the traceback)",
        "report it",
    ),
    ExitCode(
        RETRIES_EXHAUSTED,
        "retries exhausted",
        "training",
        "the pod was restarted `retries.without_progress` times while the newest checkpoint did "
        "not advance (the one line and the pod's termination message name the last failure)",
        "fix what the last failure names (out of memory: give the pod more memory); resubmit",
    ),
    ExitCode(
        NONFINITE,
        "non-finite loss",
        "training",
        "the loss or gradient norm became NaN or infinite (the log names the step and rank; "
        "diagnostics.on_nonfinite=stop or keep_last_good)",
        "lower the learning rate, clip gradients or fix the data; a retry would diverge again",
    ),
    ExitCode(
        KEEPER_UNREACHABLE,
        "keeper unreachable",
        "training",
        "the job's checkpoint keeper did not answer within the pod's wait: the rendezvous wait "
        "x (retries.without_progress + 1); every 30 s the log named the keeper and what to check",
        "check the keeper pod <job>-keeper (Pending: node selectors, taints, its claim's zone), "
        "its claim, the NetworkPolicy <job>-keeper and the Secret <job>-keeper-token; resubmit",
    ),
    ExitCode(
        WAIT_TIMEOUT, "timeout", "cli", "kubeddp wait: still running at --timeout", "wait longer"
    ),
    ExitCode(
        INTERRUPTED,
        "interrupted",
        "training",
        "Ctrl-C (SIGINT): workers saved a checkpoint and stopped",
        "run again to resume",
    ),
    ExitCode(
        KILLED,
        "killed",
        "training",
        "a worker was killed (SIGKILL: out of memory, or the grace period ran out)",
        "retried until `retries.without_progress` restarts made no progress; if it repeats, "
        "give the pod more memory",
    ),
    ExitCode(
        PREEMPTED,
        "preempted",
        "training",
        "SIGTERM (preemption, node drain, docker stop): workers saved a checkpoint and stopped",
        "retried by the operator; resumes from the checkpoint",
    ),
    ExitCode(
        RDZV_UNREACHABLE,
        "rendezvous host unreachable",
        "training",
        "the rendezvous host's name did not resolve or its port did not open in time",
        "retried; if it repeats, check that the master/rank-0 pod runs and its Service exists",
    ),
    ExitCode(
        PEER_FAILED,
        "peer failed",
        "training",
        "another process, pod or node failed, or the network or rendezvous store went away "
        "(a collective failed or timed out)",
        "retried; resumes from the newest checkpoint",
    ),
    ExitCode(
        STORAGE_UNREACHABLE,
        "checkpoint storage unreachable",
        "training",
        "the checkpoint storage (an S3 endpoint, or the job's checkpoint keeper pod) did not "
        "answer at start",
        "retried; if it repeats, check the endpoint (AWS_ENDPOINT_URL) and the network to it, "
        "or the keeper pod <job>-keeper and its claim",
    ),
    ExitCode(
        STALLED,
        "stalled",
        "training",
        "a rank made no progress for diagnostics.stall_seconds; the stall report (log and "
        "checkpoint dir) names the rank, its pod and node and where it was stuck",
        "retried (the pod is replaced); `kubeddp diagnose JOB` shows the report",
    ),
    ExitCode(
        CHECKPOINT_NOT_KEPT,
        "checkpoint not kept",
        "training",
        "training finished, but the pod's last checkpoint or files did not reach the job's "
        "checkpoint keeper before the time its grace period leaves (the log names what and why)",
        "retried: the next pod resumes from the keeper's newest checkpoint and trains the rest; "
        "if it repeats, check the keeper pod <job>-keeper and the free space of its claim",
    ),
    ExitCode(
        CRASHED,
        "crashed",
        "training",
        "a worker or launch itself was ended by a signal no other row names (SIGABRT, SIGSEGV, "
        "SIGBUS, SIGFPE, SIGILL: a crash in native code or a library's abort; SIGHUP, SIGQUIT "
        "sent from outside), or a program ended with a code of 128 or more this table does not "
        "name; the log names the signal or the code, and the rank",
        "retried until `retries.without_progress` restarts made no progress; if it repeats, "
        "the signal and rank in the log say where (a library's abort prints its reason just "
        "before)",
    ),
)
BY_CODE = {entry.code: entry for entry in TABLE}
# What every other pod of a job ends with when one pod is preempted or lost: the stop vote makes
# them save and exit PREEMPTED, their collectives fail (PEER_FAILED), a recreated pod waits for
# a rank 0 that is not back yet (RDZV_UNREACHABLE). An Indexed Job's pod failure policy ignores
# these (the preempted pod itself carries the DisruptionTarget condition), so one preemption
# does not use up backoffLimit; the pod's own failures (KILLED, a crash) still count.
CASCADE = (PREEMPTED, RDZV_UNREACHABLE, PEER_FAILED)


# The signals the table names by their own row; every other one ends as CRASHED.
SIGNAL_CODES = {signal.SIGINT: INTERRUPTED, signal.SIGKILL: KILLED, signal.SIGTERM: PREEMPTED}


def for_signal(signum: int) -> int:
    """The code of a process ended by signal `signum` (a shell would show 128 + N)."""
    return SIGNAL_CODES.get(signum, CRASHED)


def documented(code: int) -> int:
    """`code` as the table names it: a code of 128 or more that the table lacks (a program's
    own, or a signal's 128 + N) is CRASHED; below 128 a program's own code is its own."""
    return code if code in BY_CODE or 0 <= code < RETRYABLE_FROM else CRASHED


def describe(code: int) -> str:
    """`143 (preempted, retryable)` for the logs of training. A code only the CLI uses (3, 124)
    is named by what it is there: a program's own code, fatal or retryable."""
    entry = BY_CODE.get(code)
    if entry is None or entry.where == "cli":
        kind = "retryable" if code >= RETRYABLE_FROM else "fatal"
        return f"{code} ({kind})"
    return f"{code} ({entry.name}, {'retryable' if entry.retryable else 'fatal'})"
