"""Indexed Job: a batch/v1 Job in Indexed mode plus a headless Service; needs no operator.

kubeddp itself plays the operator's part: the template sets the rendezvous env that launch
reads (master `<job>-0.<job>`, node count, processes per node) and node rank = the completion
index. The rules below check that env against the Job's shape.
"""

from __future__ import annotations

from kubeddp.tools.manifests import k8s_names as names
from kubeddp.tools.manifests.kinds import (
    Issue,
    JobKind,
    Lands,
    Takes,
    mapping,
    name_issues,
    pod_count_lines,
    sequence,
    values,
)
from kubeddp.tools.manifests.resources import SERVICE, Resource
from kubeddp.trainer import constants as trainer

CONTAINER = "trainer"
PORT_NAME = "rendezvous"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
RESTART_POLICIES = ("ExitCode", "OnFailure", "Never")
JOB = "Job"  # the Indexed Job holds the pod template
EVERY_OBJECT = (values.CONFIG_MAP, values.CLAIM, "Service", JOB)  # Service: the headless one
# Every chart value: where it lands (tests/unit/test_kind_values.py sets each one).
TAKES: Takes = {
    **values.common(JOB, JOB, EVERY_OBJECT),
    **values.ONLY_FOR_PYTORCHJOB,
    **{
        path: Lands((JOB,))
        for path in (
            "nprocPerNode",
            "restartPolicy",
            "backoffLimit",
            "ttlSecondsAfterFinished",
            "timeLimit",  # spec.activeDeadlineSeconds
        )
    },
    **values.ONLY_FOR_TRAINJOB,
}


def admission_issues(doc: dict) -> list[Issue]:
    """Only for Jobs kubeddp renders: the rendezvous env must match the Job's shape."""
    labels = mapping(mapping(doc.get("metadata")).get("labels"))
    spec = mapping(doc.get("spec"))
    if (
        labels.get(names.LABEL_MANAGED_BY) != names.APP_NAME
        or spec.get("completionMode") != "Indexed"
    ):
        return []
    issues = name_issues(doc)
    name = doc["metadata"].get("name")
    completions = spec.get("completions")
    if spec.get("parallelism") != completions:
        issues.append(
            (
                "spec.parallelism",
                f"must equal completions ({completions}): every node "
                "must run at once for the rendezvous",
            )
        )
    pod = mapping(mapping(spec.get("template")).get("spec"))
    if pod.get("subdomain") != name:
        issues.append(
            (
                "spec.template.spec.subdomain",
                f"must be {name!r} (the headless Service) so {name}-0.{name} resolves",
            )
        )
    for container in sequence(pod.get("containers")):
        env = {
            e.get("name"): e.get("value")
            for e in sequence(mapping(container).get("env"))
            if isinstance(e, dict) and isinstance(e.get("name"), str)
        }
        nnodes = env.get(trainer.ENV_NNODES)
        if nnodes is not None and nnodes != str(completions):
            issues.append(
                (
                    "spec.template.spec.containers.env",
                    f"{trainer.ENV_NNODES}="
                    f"{nnodes} but completions is {completions}; make them equal",
                )
            )
    return issues


KIND = JobKind(
    name="indexedjob",
    chart_kind="IndexedJob",
    position=2,
    help="a batch/v1 Indexed Job and a headless Service: needs no operator",
    resource=Resource(JOB, "batch", "v1", "jobs"),
    container=CONTAINER,
    job_name_label=JOB_NAME_LABEL,
    index_labels=(names.JOB_COMPLETION_INDEX_LABEL,),
    rendezvous_port=trainer.INDEXEDJOB_PORT,
    rendezvous_port_name=PORT_NAME,
    success_conditions=("Complete", "SuccessCriteriaMet"),
    replica_lines=pod_count_lines,
    replica_selector=lambda replica: f"{names.JOB_COMPLETION_INDEX_LABEL}={replica}",
    admission_issues=admission_issues,
    restart_policies=RESTART_POLICIES,
    takes=TAKES,
    companions=(SERVICE,),
    chart_facts={
        "masterAddrEnv": trainer.ENV_MASTER_ADDR,
        "masterPortEnv": trainer.ENV_MASTER_PORT,
        "nnodesEnv": trainer.ENV_NNODES,
        "nprocEnv": trainer.ENV_NPROC_PER_NODE,
    },
)
