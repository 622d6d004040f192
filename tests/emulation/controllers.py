"""What the controllers do when a pod's container ends: pure functions of the job's plan, its
counters and the pod, so every rule is unit-tested without processes (test_operator_env.py).

Sources: training-operator v1.9.4 (TO) `pkg/controller.v1/common/pod.go` ReconcilePods,
`common/job.go` ReconcileJobs, `pkg/core/job.go` PastBackoffLimit, `pkg/core/pod.go`
SetRestartPolicy, `pytorchjob_controller.go` UpdateJobStatus; the Kubernetes Job controller
(`pkg/controller/job/job_controller.go`, `pod_failure_policy.go`) and its API
(k8s.io/api v0.36.2 `batch/v1/types.go`) and its pod-recreation back-off
(`pkg/controller/job/backoff_utils.go`: 10 s doubling per failed pod since the last success, at
most 6 min; since kubernetes PR #119434 pods a podFailurePolicy Ignores count too, issue
#130881); JobSet v0.12.0 `pkg/controllers/failure_policy.go` (no failurePolicy: the first failed
Job fails the JobSet, and the TrainJob copies it; with one, the first matching rule's action,
else RestartJobSet, until restarts reach maxRestarts); the Pod Security Standards (the
`restricted` profile) for admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from operator_env import JobPlan, PodPlan

SUCCEEDED = "succeeded"
RESTART_IN_PLACE = "restart-in-place"  # the kubelet restarts the container in the same pod
RECREATE = "recreate"  # the controller deletes the pod and creates a new one (new volumes)
FAIL = "fail"
# TO pod.go L339-348: a pod whose `pytorch` container never terminated (an init container
# failed) is judged by this magic code, which is >= 128 (retryable under ExitCode).
NEVER_TERMINATED = 0xBEEF


@dataclass
class Counters:
    """What the controller counts across the job's pods."""

    failed: int = 0  # batch Job: failed pods counted against backoffLimit (.status.failed)
    restarts: int = 0  # container restarts in place (restartCount) summed over the pods
    # batch Job: failed pods since the last success, counted or Ignored alike (the back-off
    # record's failuresAfterLastSuccess): what the pod-recreation delay grows with
    failures_since_success: int = 0
    jobset_restarts: int = 0  # JobSet: gang restarts so far (.status.restarts)


# K8S backoff_utils.go / job_controller.go: DefaultJobPodFailureBackOff, MaxJobPodFailureBackOff
JOB_POD_FAILURE_BACKOFF_SECONDS = 10.0
JOB_POD_FAILURE_BACKOFF_MAX_SECONDS = 360.0


def job_recreation_delay(failures_since_success: int) -> float:
    """Seconds the Job controller waits before it creates the replacement of a failed pod."""
    if failures_since_success <= 0:
        return 0.0
    delay = JOB_POD_FAILURE_BACKOFF_SECONDS * 2 ** (failures_since_success - 1)
    return min(delay, JOB_POD_FAILURE_BACKOFF_MAX_SECONDS)


@dataclass(frozen=True)
class Decision:
    action: str  # SUCCEEDED | RESTART_IN_PLACE | RECREATE | FAIL
    reason: str = ""
    counted: bool = False  # a batch Job: counted in .status.failed


@dataclass
class Ended:
    """A pod's main container ended (or its init container failed)."""

    pod: PodPlan
    exit_code: int | None  # None: the main container never ran
    conditions: set[str] = field(default_factory=set)  # e.g. DisruptionTarget


def pod_restart_policy(plan: JobPlan, pod: PodPlan) -> str:
    """The restartPolicy of the pod itself (what the kubelet obeys)."""
    policy = plan.restart_policy[pod.replica_type]
    if plan.kind == "PyTorchJob" and policy == "ExitCode":
        return "Never"  # TO pkg/core/pod.go SetRestartPolicy L81-88
    return policy


def decide(plan: JobPlan, counters: Counters, ended: Ended) -> Decision:
    """succeeded / restart in place / recreate / fail the job; updates `counters`."""
    if ended.exit_code == 0:
        return Decision(SUCCEEDED)
    if pod_restart_policy(plan, ended.pod) in ("OnFailure", "Always"):
        counters.restarts += 1
        limit = plan.backoff_limit
        # TO PastBackoffLimit / K8S pastBackoffLimitOnFailure: the restartCounts of the pods
        # add up; the job fails when the sum reaches backoffLimit (> 0 when it is 0).
        if limit is not None and counters.restarts >= max(limit, 1):
            return Decision(FAIL, f"BackoffLimitExceeded: {counters.restarts} restarts")
        return Decision(RESTART_IN_PLACE)
    if plan.kind == "PyTorchJob":
        return _pytorchjob_pod_failed(plan, ended)
    return _job_pod_failed(plan, counters, ended)


def _pytorchjob_pod_failed(plan: JobPlan, ended: Ended) -> Decision:
    code = NEVER_TERMINATED if ended.exit_code is None else ended.exit_code
    if plan.backoff_limit == 0:  # common/job.go L176-192: 1 > backoffLimit with a fake queue
        return Decision(FAIL, f"BackoffLimitExceeded: pod {ended.pod.name} exited {code}")
    if plan.restart_policy[ended.pod.replica_type] == "ExitCode" and code >= 128:
        return Decision(RECREATE, f"exit {code} is retryable")  # never counted: L115-125
    return Decision(FAIL, f"pod {ended.pod.name} exited {code}")


def _job_pod_failed(plan: JobPlan, counters: Counters, ended: Ended) -> Decision:
    """A batch/v1 Job pod in phase Failed: its pod failure policy, then backoffLimit."""
    action = match_pod_failure_policy(plan.pod_failure_rules, ended)
    code = ended.exit_code
    counters.failures_since_success += 1  # Ignored ones too (PR #119434)
    if action == "FailJob":
        return Decision(FAIL, f"PodFailurePolicy: pod {ended.pod.name} exited {code}")
    if action == "Ignore":
        return Decision(RECREATE, f"ignored: exit {code}, conditions {sorted(ended.conditions)}")
    counters.failed += 1
    if plan.backoff_limit is not None and counters.failed > plan.backoff_limit:
        return Decision(FAIL, f"BackoffLimitExceeded: {counters.failed} failed pods", True)
    return Decision(RECREATE, f"counted: {counters.failed} failed pods", True)


# JobSet: the reason a child Job failed, as the Job controller writes it in its Failed condition
JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "PodFailurePolicy", "DeadlineExceeded")
RESTART_JOBSET = "RestartJobSet"
FAIL_JOBSET = "FailJobSet"


def job_failure_reason(decision: Decision) -> str:
    return decision.reason.split(":", 1)[0]


def jobset_on_job_failure(
    policy: dict[str, Any] | None, counters: Counters, reason: str
) -> tuple[str, str]:
    """JobSet failure_policy.go: what a failed child Job does to the JobSet (FAIL_JOBSET or
    RESTART_JOBSET, and why); a restart is counted in `counters`."""
    if policy is None:
        return FAIL_JOBSET, f"FailedJobs: a Job failed ({reason}) and there is no failurePolicy"
    action = RESTART_JOBSET
    for rule in policy.get("rules") or []:
        reasons = rule.get("onJobFailureReasons") or []
        if not reasons or reason in reasons:
            action = rule["action"]
            break
    if action == FAIL_JOBSET:
        return FAIL_JOBSET, f"FailJobSetAction: rule for {reason}"
    if action == RESTART_JOBSET:
        limit = int(policy.get("maxRestarts") or 0)
        if counters.jobset_restarts >= limit:
            return FAIL_JOBSET, f"ReachedMaxRestarts: {counters.jobset_restarts} restarts"
        counters.jobset_restarts += 1
        return RESTART_JOBSET, f"restart {counters.jobset_restarts} of {limit} ({reason})"
    raise ValueError(f"JobSet failurePolicy action {action!r} is not emulated")


def match_pod_failure_policy(rules: list[dict[str, Any]], ended: Ended) -> str:
    """The first matching rule's action (FailJob | Ignore | Count | FailIndex), else Count."""
    for rule in rules:
        if "onPodConditions" in rule:
            conditions = rule["onPodConditions"]
            wanted = {c["type"] for c in conditions if c.get("status", "True") == "True"}
            if wanted & ended.conditions:
                return rule["action"]
            continue
        on_exit = rule.get("onExitCodes") or {}
        container = on_exit.get("containerName")
        names = {ended.pod.container.get("name")}
        if container is not None and container not in names:
            continue
        code = ended.exit_code
        if code is None or code == 0:  # exit code 0 is never matched
            continue
        values = {int(v) for v in on_exit.get("values", [])}
        inside = code in values
        if (on_exit.get("operator") == "In") == inside:
            return rule["action"]
    return "Count"


def past_deadline(plan: JobPlan, active_seconds: float) -> Decision | None:
    """The job's activeDeadlineSeconds: FAIL once the job has been active that long (every pod
    stopped, no retry), whatever its backoff or restart budget; None before. TO pkg/core/job.go
    PastActiveDeadline L82-91 and K8S job_controller.go pastActiveDeadline: `elapsed >=
    deadline` since status.startTime; TR trainjob_controller.go reconcileDeadline L155-176:
    `now.After(deadline)` since the TrainJob's creation, then it deletes the JobSet. All three
    fail with reason DeadlineExceeded (TO: PyTorchJobFailed, "active longer than specified
    deadline")."""
    limit = plan.active_deadline_seconds
    if limit is None:
        return None
    past = active_seconds > limit if plan.kind == "TrainJob" else active_seconds >= limit
    if not past:
        return None
    return Decision(FAIL, f"DeadlineExceeded: active {active_seconds:.0f}s, limit {limit}s")


def job_succeeded(plan: JobPlan, done: set[str]) -> bool:
    if plan.kind == "PyTorchJob":
        masters = [p.name for p in plan.pods if p.replica_type == "Master"]
        if masters:
            return all(m in done for m in masters)  # the Master decides
        workers = [p.name for p in plan.pods if p.replica_type == "Worker"]
        return all(w in done for w in workers) or (plan.elastic and bool(done))
    return all(p.name in done for p in plan.pods)  # Indexed Job / JobSet: every pod


# ---------------------------------------------------------------- Pod Security admission
ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def restricted_violations(pod: PodPlan) -> list[str]:
    """Why the Pod Security `restricted` profile rejects the pod (empty: admitted). The checks
    that matter for a training pod: privilege escalation, capabilities, non-root, seccomp,
    volume types."""
    found = []
    pod_context = pod.security_context
    for container in [*pod.init_containers, pod.container]:
        name = container.get("name")
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f'allowPrivilegeEscalation != false (container "{name}")')
        drop = (context.get("capabilities") or {}).get("drop") or []
        if "ALL" not in drop:
            found.append(f'unrestricted capabilities (container "{name}" must drop ALL)')
        if context.get("privileged"):
            found.append(f'privileged (container "{name}")')
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True or context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f'runAsNonRoot != true (container "{name}")')
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get(
            "type"
        )
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f'seccompProfile (container "{name}" must be RuntimeDefault)')
    for volume in pod.volumes:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"restricted volume types ({volume['name']}: {sorted(kinds)})")
    return found
