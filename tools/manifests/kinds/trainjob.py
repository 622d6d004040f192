"""TrainJob (Kubeflow Trainer v2.3) on a torch-distributed training runtime.

The admission rules follow the Trainer v2.3 TrainJob webhook. `runtimePatches` cannot set a
priority class, restart or backoff settings or container ports, so by default the chart also
renders a TrainingRuntime named after the job (trainJob.ownRuntime): the torch runtime plus a
JobSet failurePolicy and Job limits that fit a gang. Without it Trainer's ClusterTrainingRuntime
has neither: pods restart OnFailure, the Job's backoffLimit (6) counts restarts summed over all
pods, and the first failed Job fails the TrainJob (JobSet v0.12 failure_policy.go).
"""

from __future__ import annotations

from kubeddp.tools.manifests import schema_checks
from kubeddp.tools.manifests.k8s_names import JOB_COMPLETION_INDEX_LABEL
from kubeddp.tools.manifests.kinds import (
    Issue,
    JobKind,
    Lands,
    Refused,
    Takes,
    container_names,
    mapping,
    name_issues,
    sequence,
    trainjob_fields,
    values,
)
from kubeddp.tools.manifests.resources import TRAINING_RUNTIME, Resource
from kubeddp.trainer import constants as trainer

TRAINER_VERSION = "v2.3.0"
INSTALL = (
    f"install Kubeflow Trainer {TRAINER_VERSION}: kubectl apply --server-side -k "
    f'"github.com/kubeflow/trainer.git/manifests/overlays/manager?ref={TRAINER_VERSION}" && '
    "kubectl apply --server-side -k "
    f'"github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref={TRAINER_VERSION}"'
)
RESOURCE = Resource("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs")
CONTAINER = "node"
REPLICATED_JOB = "node"  # the replicatedJob of the torch-distributed runtime
JOB_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"  # initializers are others
RUNTIME_PATCH_MANAGER = "kubeddp.io/render"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
DEFAULT_RUNTIME = "torch-distributed"
# The label that marks the replicatedJob Trainer's torch plugin fills (PET_* env, numNodes).
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
# The JobSet failurePolicy rule of the runtime kubeddp renders: a Job failed by its pod failure
# policy (an exit code 1-127: a mistake that fails the same way every time) fails the JobSet.
FATAL_JOBSET_RULE = "fatalExitCode"
RESERVED_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
NO_RUNTIME_PATCH = (
    "Trainer v2.3 runtimePatches have no such field; set it in the ClusterTrainingRuntime, "
    "or use kind PyTorchJob"
)

JOB = RESOURCE.kind  # the TrainJob holds the pod fields (spec.trainer, runtimePatches)
RUNTIME = TRAINING_RUNTIME.kind  # the runtime kubeddp renders (trainJob.ownRuntime)
# Pod fields kubeddp writes whatever the values say, which a TrainJob leaves to its runtime:
# with no ServiceAccount named, the pods get the namespace's default one and its token.
RUNTIME_DECIDES = ("spec.automountServiceAccountToken",)


def pod_field_takes(field: str) -> Lands | Refused:
    """A pod field's value lands in the TrainJob when its CRD lets it set the field."""
    return Lands((JOB,)) if field in trainjob_fields.admitted() else Refused(NO_RUNTIME_PATCH)


# Every chart value: where it lands (tests/unit/test_kind_values.py sets each one).
TAKES: Takes = {
    **values.common(JOB, JOB, (values.CONFIG_MAP, values.CLAIM, JOB, RUNTIME)),
    **values.ONLY_FOR_PYTORCHJOB,
    **{path: pod_field_takes(field) for path, field in values.POD_FIELDS.items()},
    "nprocPerNode": Lands((JOB,)),
    "backoffLimit": Lands((RUNTIME,)),
    "trainJob.ownRuntime": Lands((JOB, RUNTIME)),
    "trainJob.runtimeName": Lands((JOB,)),  # with ownRuntime false
    "trainJob.runtimeKind": Lands((JOB,)),  # with ownRuntime false
    "restartPolicy": Refused(NO_RUNTIME_PATCH),
    "ttlSecondsAfterFinished": Refused(NO_RUNTIME_PATCH),
    "timeLimit": Lands((JOB,)),  # spec.activeDeadlineSeconds (Trainer v2.2+)
    # refused as pod fields above; said with what to do instead
    "image.pullPolicy": Refused(
        "Trainer v2.3 has no field for it (trainer.image only, and runtimePatches cannot set "
        "it): the runtime's container decides; leave it unset"
    ),
    "envFrom": Refused(
        "Trainer v2.3 has no envFrom (neither spec.trainer nor runtimePatches); use "
        "--env-secret VAR=SECRET:KEY (extraEnv valueFrom a Secret key), or kind PyTorchJob"
    ),
}


def _patch_container_issues(spec: dict) -> list[Issue]:
    issues: list[Issue] = []
    for p_index, patch in enumerate(sequence(spec.get("runtimePatches"))):
        runtime = mapping(mapping(patch).get("trainingRuntimeSpec"))
        jobs = sequence(mapping(mapping(runtime.get("template")).get("spec")).get("replicatedJobs"))
        for j_index, job in enumerate(jobs):
            job = mapping(job)
            if job.get("name") != REPLICATED_JOB:
                continue
            pod = mapping(mapping(job.get("template")).get("spec")).get("template")
            for c_index, name in enumerate(container_names(pod)):
                if name != CONTAINER:
                    issues.append(
                        (
                            f"spec.runtimePatches[{p_index}].trainingRuntimeSpec.template"
                            f".spec.replicatedJobs[{j_index}].template.spec.template.spec"
                            f".containers[{c_index}].name",
                            f"{name!r}: the trainer container is named {CONTAINER!r}",
                        )
                    )
    return issues


def admission_issues(doc: dict) -> list[Issue]:
    issues = name_issues(doc)
    spec = mapping(doc.get("spec"))
    trainer_spec = mapping(spec.get("trainer"))
    for index, var in enumerate(sequence(trainer_spec.get("env"))):
        name = mapping(var).get("name")
        if name in RESERVED_ENV:
            issues.append(
                (
                    f"spec.trainer.env[{index}].name",
                    f"{name} is set by the torch "
                    "runtime; remove it (use trainer.numNodes / numProcPerNode)",
                )
            )
    for key in ("numNodes", "numProcPerNode"):
        value = trainer_spec.get(key)
        if isinstance(value, int) and value < 1:
            issues.append((f"spec.trainer.{key}", f"{value} must be >= 1"))
    return issues + _patch_container_issues(spec)


def replica_lines(status: dict) -> list[str]:
    return [
        f"  {job.get('name')}: "
        + ", ".join(f"{k}={job.get(k, 0)}" for k in ("active", "ready", "succeeded", "failed"))
        for job in status.get("jobsStatus") or []
    ]


KIND = JobKind(
    name="trainjob",
    chart_kind="TrainJob",
    position=1,
    help="Kubeflow Trainer v2.3, on the training runtime below",
    resource=RESOURCE,
    container=CONTAINER,
    job_name_label=JOB_NAME_LABEL,
    index_labels=(JOB_COMPLETION_INDEX_LABEL,),
    rendezvous_port=trainer.TRAINJOB_PORT,
    success_conditions=("Complete",),
    replica_lines=replica_lines,
    replica_selector=lambda replica: f"{JOB_COMPLETION_INDEX_LABEL}={replica}",
    node_rank_selector=lambda job, rank: (
        f"{REPLICATED_JOB_LABEL}={REPLICATED_JOB},{JOB_COMPLETION_INDEX_LABEL}={rank}"
    ),
    admission_issues=admission_issues,
    schema_issues=schema_checks.trainjob_issues,
    install_hint=INSTALL,
    companions=(TRAINING_RUNTIME,),
    nproc_words=("auto",),  # numProcPerNode is an integer; unset = the runtime decides
    takes=TAKES,
    auto_rank=0,  # kind auto: Kubeflow Trainer, the current operator
    chart_facts={
        "replicatedJob": REPLICATED_JOB,
        "runtimePatchManager": RUNTIME_PATCH_MANAGER,
        "runtimeApiGroup": RESOURCE.group,
        "runtimeKind": RUNTIME_KINDS[1],
        "ancestorLabel": ANCESTOR_LABEL,
        "fatalJobSetRule": FATAL_JOBSET_RULE,
        "podSplit": trainjob_fields.split_table(),  # templates/_trainjob.tpl
    },
)
