"""The emulated operators' rules on hand-written and rendered manifests (no processes, no
root): the pods and env they create, and what their controllers do when a container ends."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from cluster import EmulatedCluster
from controllers import (
    FAIL,
    FAIL_JOBSET,
    RECREATE,
    RESTART_IN_PLACE,
    RESTART_JOBSET,
    Counters,
    Ended,
    decide,
    job_failure_reason,
    job_recreation_delay,
    jobset_on_job_failure,
    past_deadline,
    restricted_violations,
)
from operator_env import (
    INIT_CONTAINER_NAME,
    TABLE_FILE,
    JobPlan,
    ManifestError,
    container_env,
    indexedjob_plan,
    plan_from_documents,
    pytorchjob_plan,
    table,
    trainjob_plan,
    with_trainjob_status,
)

from kubeddp.trainer import exit_codes
from tests.helpers.reference import ENV_MATRIX, require
from tests.helpers.render import render_job


def _template(port: int | None = None, env: list | None = None) -> dict:
    container: dict = {"name": "pytorch", "image": "kubeddp:cpu", "env": env or []}
    if port:
        container["ports"] = [{"name": "pytorchjob-port", "containerPort": port}]
    return {"spec": {"containers": [container]}}


def _pytorchjob(spec_extra: dict, master: bool = True, workers: int = 2) -> dict:
    replicas = {"Worker": {"replicas": workers, "template": _template()}}
    if master:
        replicas["Master"] = {"replicas": 1, "template": _template(port=1234)}
    return {"metadata": {"name": "job"}, "spec": {"pytorchReplicaSpecs": replicas, **spec_extra}}


def test_pytorchjob_master_env_world_size_counts_auto_as_one() -> None:
    plan = pytorchjob_plan(_pytorchjob({}))
    assert [p.name for p in plan.pods] == ["job-master-0", "job-worker-0", "job-worker-1"]
    worker1 = plan.pods[2].operator_env
    assert worker1 == {
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": "job-master-0",
        "PET_MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "1234",  # the Master's pytorchjob-port
        "PET_MASTER_PORT": "1234",
        "WORLD_SIZE": "3",  # nprocPerNode defaults to auto, which counts as 1
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "auto",
        "RANK": "2",
        "PET_NODE_RANK": "2",
    }


def test_pytorchjob_world_size_multiplies_integer_nproc() -> None:
    plan = pytorchjob_plan(_pytorchjob({"nprocPerNode": "4"}))
    assert plan.pods[0].operator_env["WORLD_SIZE"] == "12"
    assert plan.pods[1].operator_env["RANK"] == "1"


def test_elastic_env_without_master() -> None:
    policy = {"minReplicas": 2, "rdzvBackend": "c10d", "maxRestarts": 5,
              "rdzvConf": [{"key": "join_timeout", "value": "60"}]}  # fmt: skip
    plan = pytorchjob_plan(_pytorchjob({"elasticPolicy": policy}, master=False, workers=3))
    env = plan.pods[1].operator_env
    assert env["PET_NNODES"] == "2:2"  # maxReplicas defaults to minReplicas
    assert env["PET_RDZV_ENDPOINT"] == "job-worker-0:23456"
    assert env["PET_MAX_RESTARTS"] == "5"
    assert env["PET_RDZV_CONF"] == "join_timeout=60"
    assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE"} & set(env)
    assert plan.elastic


def test_master_replicas_must_be_one() -> None:
    job = _pytorchjob({})
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(ManifestError, match="Master.replicas must be 1"):
        pytorchjob_plan(job)


def test_trainjob_uses_runtime_and_cpu_count_and_completion_index() -> None:
    job = {
        "metadata": {"name": "tj"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "args": ["--"],
                        "resourcesPerNode": {"requests": {"cpu": "1500m"}}},
        },
    }  # fmt: skip
    plan = trainjob_plan(job)
    pod = plan.pods[1]
    assert pod.name == "tj-node-0-1" and "tj-node-0-1.tj" in pod.dns_names
    assert "command" not in pod.container  # the v2.3 runtime has none: the image entrypoint
    env = container_env(pod, "default", "198.51.100.5")
    assert env["PET_NPROC_PER_NODE"] == "2"  # CPU requests rounded up
    assert env["PET_NODE_RANK"] == "1"  # from the completion-index annotation
    assert env["PET_MASTER_ADDR"] == "tj-node-0-0.tj"
    assert "MASTER_ADDR" not in env and "WORLD_SIZE" not in env


def test_indexed_job_resolves_field_refs_and_expands_vars() -> None:
    job = {
        "metadata": {"name": "ij"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "template": {"spec": {"subdomain": "svc", "restartPolicy": "Never", "containers": [{
                "name": "trainer",
                "env": [
                    {"name": "IDX", "valueFrom": {"fieldRef": {"fieldPath":
                        "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                    {"name": "ME", "value": "pod-$(IDX)"},
                ],
            }]}},
        },
    }  # fmt: skip
    plan = indexedjob_plan(job)
    env = container_env(plan.pods[1], "default", "198.51.100.5")
    assert env["IDX"] == "1" and env["ME"] == "pod-1" and env["JOB_COMPLETION_INDEX"] == "1"
    assert plan.pods[1].dns_names[-1] == "ij-1.svc"


def test_paths_in_args_are_rewritten_to_volume_dirs(tmp_path: Path) -> None:
    mounts = {"/etc/kubeddp": tmp_path / "cm", "/checkpoints": tmp_path / "ck"}
    rewrite = EmulatedCluster.rewrite_path
    assert rewrite("/etc/kubeddp/config.yaml", mounts) == f"{tmp_path}/cm/config.yaml"
    assert rewrite("checkpoint.dir=/checkpoints", mounts) == f"checkpoint.dir={tmp_path}/ck"
    assert rewrite("/checkpointsX", mounts) == "/checkpointsX"


# ---- the operator table: the project's own copy of what each operator injects -------------


def test_operator_table_rows_cite_their_upstream_file() -> None:
    for row in table():
        assert row["source_path"] and row["source_ref"], row
        assert row["operator"] and row["env_var"] and row["condition"], row


def test_operator_table_agrees_with_the_reference_matrix() -> None:
    with require(ENV_MATRIX).open(newline="") as handle:
        reference = list(csv.DictReader(handle))
    ours = {tuple(row.items()) for row in table()}
    missing = [row for row in reference if tuple(row.items()) not in ours]
    assert not missing, f"{TABLE_FILE.name} lacks or differs from the matrix on: {missing}"


# ---- TrainJob (Trainer v2.3 + JobSet): restarts in place, backoffLimit 6, merged resources --


def _trainjob(trainer: dict) -> dict:
    return {
        "metadata": {"name": "tj"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer},
    }


def _runtime(resources: dict) -> dict:
    return {
        "metadata": {"name": "torch-distributed"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                            "trainer"}},
                    "spec": {"template": {"spec": {"containers": [
                        {"name": "node", "image": "x", "resources": resources}
                    ]}}},
                },
            }]}},
        },
    }  # fmt: skip


def _fail_n_times(plan: JobPlan, code: int, times: int) -> list[str]:
    counters = Counters()
    return [decide(plan, counters, Ended(plan.pods[0], code)).action for _ in range(times)]


def test_trainjob_pods_restart_in_place_until_the_jobs_backoff_limit_of_six() -> None:
    plan = trainjob_plan(_trainjob({"numNodes": 2}))
    assert plan.restart_policy == {"node": "OnFailure"}  # JobSet's default, the runtime has none
    assert plan.backoff_limit == 6  # the Job API default; neither JobSet nor Trainer sets one
    # Restarts of all pods add up: five restarts in place, the sixth fails the job (any code).
    assert _fail_n_times(plan, exit_codes.TRAINING_FAILED, 6) == [RESTART_IN_PLACE] * 5 + [FAIL]


def test_trainjob_resources_merge_with_the_runtime_and_nproc_reads_resources_per_node() -> None:
    runtime = _runtime({"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "2"}})
    job = _trainjob({"numNodes": 1, "resourcesPerNode": {"requests": {"cpu": "3500m"}}})
    plan = trainjob_plan(job, runtime)
    pod = plan.pods[0]
    assert pod.container["resources"] == {
        "limits": {"nvidia.com/gpu": 1},  # kept from the runtime
        "requests": {"cpu": "3500m"},  # the TrainJob's value wins per key
    }
    # resourcesPerNode alone decides: no GPU named there, so the CPU count (rounded up)
    env = container_env(pod, "default", "198.51.100.5")
    assert env["PET_NPROC_PER_NODE"] == "4"
    assert env["JOB_COMPLETION_INDEX"] == env["PET_NODE_RANK"] == "0"
    # numProcPerNode, when given, is what the workers get
    job["spec"]["trainer"]["numProcPerNode"] = 1
    assert trainjob_plan(job, runtime).pods[0].operator_env["PET_NPROC_PER_NODE"] == "1"


def test_trainjob_pods_carry_job_completion_index() -> None:
    plan = trainjob_plan(_trainjob({"numNodes": 3}))
    env = container_env(plan.pods[2], "default", "198.51.100.7")
    assert env["JOB_COMPLETION_INDEX"] == "2"


def test_the_trainjob_status_gate_gives_every_trainer_container_the_endpoint() -> None:
    """trainjobstatus.go: the URL of the controller's status server for this TrainJob, and a
    projected volume with the CA and a token whose audience is this TrainJob's status."""
    plan = with_trainjob_status(trainjob_plan(_trainjob({"numNodes": 2})), "team")
    audience = "trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/tj/status"
    for pod in plan.pods:
        env = container_env(pod, "team", "198.51.100.7")
        assert env["KUBEFLOW_TRAINER_SERVER_URL"] == (
            f"https://kubeflow-trainer-controller-manager.kubeflow-system.svc:10443/apis/{audience}"
        )
        assert env["KUBEFLOW_TRAINER_SERVER_CA_CERT"] == "/var/run/secrets/kubeflow/trainer/ca.crt"
        assert env["KUBEFLOW_TRAINER_SERVER_TOKEN"] == "/var/run/secrets/kubeflow/trainer/token"
        (volume,) = [v for v in pod.volumes if v["name"] == "kubeflow-trainer-token"]
        token, ca = volume["projected"]["sources"]
        assert token["serviceAccountToken"]["audience"] == audience
        assert ca["configMap"]["name"] == "tj-tls-config"
        assert {"name": "kubeflow-trainer-token", "mountPath": "/var/run/secrets/kubeflow/trainer",
                "readOnly": True} in pod.container["volumeMounts"]  # fmt: skip
    assert "KUBEFLOW_TRAINER_SERVER_URL" not in trainjob_plan(_trainjob({})).pods[0].operator_env


# ---- PyTorchJob (training-operator v1.9): ExitCode, backoffLimit ----------------------------


def _workers_job(policy: str, backoff: int | None) -> JobPlan:
    job = _pytorchjob({}, master=False, workers=3)
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = policy
    if backoff is not None:
        job["spec"]["runPolicy"] = {"backoffLimit": backoff}
    return pytorchjob_plan(job)


def test_exit_code_recreations_never_count_against_backoff_limit() -> None:
    plan = _workers_job("ExitCode", backoff=1)
    assert _fail_n_times(plan, exit_codes.PEER_FAILED, 10) == [RECREATE] * 10
    assert _fail_n_times(plan, exit_codes.KILLED, 3) == [RECREATE] * 3
    assert _fail_n_times(plan, exit_codes.TRAINING_FAILED, 1) == [FAIL]
    # An init container that failed: `pytorch` never terminated, judged as 0xbeef (retryable).
    assert decide(plan, Counters(), Ended(plan.pods[1], None)).action == RECREATE


def test_backoff_limit_zero_fails_at_the_first_failed_pod() -> None:
    assert _fail_n_times(_workers_job("ExitCode", backoff=0), exit_codes.KILLED, 1) == [FAIL]


def test_unset_pytorchjob_backoff_limit_is_unlimited() -> None:
    plan = _workers_job("OnFailure", backoff=None)
    assert plan.backoff_limit is None
    assert _fail_n_times(plan, exit_codes.TRAINING_FAILED, 20) == [RESTART_IN_PLACE] * 20


def test_on_failure_restarts_in_place_count_against_backoff_limit() -> None:
    plan = _workers_job("OnFailure", backoff=3)
    assert _fail_n_times(plan, exit_codes.KILLED, 3) == [RESTART_IN_PLACE] * 2 + [FAIL]


@pytest.mark.parametrize("kind", ["pytorchjob", "indexedjob", "trainjob"])
def test_each_controller_ends_the_job_at_its_time_limit(kind: str) -> None:
    """--time-limit lands in the field each controller reads; the job fails at it, retries left
    or not (PyTorchJob and Job: at the deadline; Trainer: once past it)."""
    plan = plan_from_documents(
        render_job(kind, "--name", "t", "--nodes", "2", "--time-limit", "1h")
    )
    assert plan.active_deadline_seconds == 3600
    assert past_deadline(plan, 3599.0) is None
    at = past_deadline(plan, 3600.0)
    assert (at is None) == (kind == "trainjob")
    after = past_deadline(plan, 3600.5)
    assert after is not None and after.action == FAIL
    assert after.reason.startswith("DeadlineExceeded")
    untimed = plan_from_documents(render_job(kind, "--name", "u"))
    assert untimed.active_deadline_seconds is None and past_deadline(untimed, 1e9) is None


# ---- rendered jobs: the Worker-only shape, the init container, the Indexed Job's policy ----


def test_a_master_makes_the_operator_add_init_pytorch_to_every_worker() -> None:
    plan = plan_from_documents(render_job("pytorchjob", "--name", "m", "--nodes", "3",
                                          "--master-replica"))  # fmt: skip
    inits = {p.name: [c["name"] for c in p.init_containers] for p in plan.pods}
    assert inits == {"m-master-0": [], "m-worker-0": [INIT_CONTAINER_NAME],
                     "m-worker-1": [INIT_CONTAINER_NAME]}  # fmt: skip
    worker = plan.pods[1]
    assert "nslookup m-master-0" in worker.init_containers[0]["command"][-1]
    # No securityContext: a namespace enforcing `restricted` rejects the Workers, not the Master.
    assert restricted_violations(plan.pods[0]) == []
    violations = restricted_violations(worker)
    assert violations and all(f'"{INIT_CONTAINER_NAME}"' in v for v in violations), violations


def test_the_default_pytorchjob_is_workers_only_admitted_by_restricted() -> None:
    plan = plan_from_documents(render_job("pytorchjob", "--name", "w", "--nodes", "3"))
    assert [p.name for p in plan.pods] == ["w-worker-0", "w-worker-1", "w-worker-2"]
    for pod in plan.pods:
        assert pod.init_containers == [] and restricted_violations(pod) == []
        env = container_env(pod, "default", "198.51.100.9")
        assert env["KUBEDDP_NODE_RANK"] == str(pod.index)  # the replica-index label
        assert env["PET_NNODES"] == env["KUBEDDP_NNODES"] == "3"
        assert "MASTER_ADDR" not in env and "RANK" not in env
    assert plan.pods[0].labels["training.kubeflow.org/job-role"] == "master"
    assert plan.backoff_limit == 3 and plan.restart_policy == {"Worker": "ExitCode"}


def test_indexed_job_policy_ignores_a_preemptions_cascade_and_counts_the_rest() -> None:
    plan = plan_from_documents(render_job("indexedjob", "--name", "ij", "--nodes", "6"))
    assert plan.backoff_limit == 3
    counters = Counters()
    pods = plan.pods

    def action(pod: int, code: int | None, *conditions: str) -> str:
        return decide(plan, counters, Ended(pods[pod], code, set(conditions))).action

    # One preemption: the preempted pod (DisruptionTarget, SIGKILLed after the grace) and the
    # codes its five peers end with are not counted, however often it happens.
    for _ in range(3):
        assert action(2, exit_codes.KILLED, "DisruptionTarget") == RECREATE
        for pod in (0, 1, 3, 4, 5):
            for code in exit_codes.CASCADE:
                assert action(pod, code) == RECREATE
    assert counters.failed == 0
    # The program's own error ends the job at once.
    assert action(0, exit_codes.TRAINING_FAILED) == FAIL
    # A pod's own retryable failure (OOM) counts: the fourth exceeds backoffLimit 3.
    assert [action(1, exit_codes.KILLED) for _ in range(4)] == [RECREATE] * 3 + [FAIL]


# ---- the failures issue 21 found, reproduced: summed backoff, growing delay, JobSet ----------


def test_a_trainjob_on_trainers_runtime_fails_at_its_first_pod_failure_from_six_nodes() -> None:
    """Trainer's torch-distributed: one failure makes every peer exit (201); their restarts
    in place add up to the Job's backoffLimit 6, and with no JobSet failurePolicy the first
    failed Job fails the TrainJob."""
    plan = trainjob_plan(_trainjob({"numNodes": 8}))
    assert plan.jobset_failure_policy is None
    counters = Counters()
    actions = [
        decide(plan, counters, Ended(pod, exit_codes.PEER_FAILED)).action for pod in plan.pods
    ]
    assert actions[:5] == [RESTART_IN_PLACE] * 5 and actions[5] == FAIL
    assert jobset_on_job_failure(None, counters, "BackoffLimitExceeded")[0] == FAIL_JOBSET


def test_kubeddps_trainjob_runtime_survives_preemptions_and_restarts_the_gang() -> None:
    plan = plan_from_documents(render_job("trainjob", "--name", "tj", "--nodes", "8"))
    assert plan.restart_policy == {"node": "Never"} and plan.backoff_limit == 3
    policy = plan.jobset_failure_policy
    assert policy is not None and policy["maxRestarts"] == 3
    counters = Counters()
    # A preempted pod and whatever its peers end with are not counted, however often.
    for _ in range(5):
        ended = Ended(plan.pods[3], exit_codes.KILLED, {"DisruptionTarget"})
        assert decide(plan, counters, ended).action == RECREATE
        for pod in plan.pods[4:]:
            assert decide(plan, counters, Ended(pod, exit_codes.PEER_FAILED)).action == RECREATE
    assert counters.failed == 0
    # Its own retryable failures (OOM) count; the Job fails, and the JobSet restarts the gang
    # at most maxRestarts times.
    decisions = [decide(plan, counters, Ended(plan.pods[1], exit_codes.KILLED)) for _ in range(4)]
    assert [d.action for d in decisions] == [RECREATE] * 3 + [FAIL]
    reason = job_failure_reason(decisions[-1])
    assert reason == "BackoffLimitExceeded"
    restarts = [jobset_on_job_failure(policy, counters, reason)[0] for _ in range(4)]
    assert restarts == [RESTART_JOBSET] * 3 + [FAIL_JOBSET]
    # A fatal exit code (the program's own error, an exhausted retry budget) ends it at once.
    fatal = decide(plan, Counters(), Ended(plan.pods[0], exit_codes.RETRIES_EXHAUSTED))
    assert fatal.action == FAIL and job_failure_reason(fatal) == "PodFailurePolicy"
    assert jobset_on_job_failure(policy, Counters(), "PodFailurePolicy")[0] == FAIL_JOBSET


def test_ignored_failures_still_grow_the_jobs_recreation_delay() -> None:
    """kubernetes PR #119434 / issue #130881: one preemption in a 6-pod Indexed Job whose
    peers all exit makes 6 failed pods, all Ignored, and the replacements wait 320 s."""
    plan = plan_from_documents(render_job("indexedjob", "--name", "ij", "--nodes", "6"))
    counters = Counters()
    decide(plan, counters, Ended(plan.pods[2], exit_codes.PREEMPTED, {"DisruptionTarget"}))
    for pod in (0, 1, 3, 4, 5):
        decide(plan, counters, Ended(plan.pods[pod], exit_codes.PREEMPTED))
    assert counters.failed == 0 and counters.failures_since_success == 6
    assert job_recreation_delay(counters.failures_since_success) == 320
    assert [job_recreation_delay(n) for n in (0, 1, 2, 3)] == [0, 10, 20, 40]
    assert job_recreation_delay(32) == 360  # the 6 min cap: every later incident waits that
