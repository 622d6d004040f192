"""Render a job the way `kubeddp render KIND ...` does, as objects (no printing, no validation)."""

from __future__ import annotations

import base64
import copy

from kubeddp.tools.cli.main import parse_command
from kubeddp.tools.manifests.chart.render import render_documents
from kubeddp.tools.manifests.chart.render_options import values_from_args


def render_job(*argv: str) -> list[dict]:
    """`render_job("pytorchjob", "--nodes", "2")`: the objects in apply order."""
    args = parse_command(["render", *argv])
    return render_documents(*values_from_args(args))


def job_of(*argv: str) -> dict:
    """The job object (PyTorchJob, TrainJob or batch/v1 Job) of a render."""
    (job,) = [d for d in render_job(*argv) if d["kind"] in ("PyTorchJob", "TrainJob", "Job")]
    return job


def pod_templates(job: dict) -> list[dict]:
    """The pod templates of a rendered job (a TrainJob's: the pod of its runtimePatches)."""
    if job["kind"] == "PyTorchJob":
        return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    if job["kind"] == "TrainJob":
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        return [patch["replicatedJobs"][0]["template"]["spec"]["template"]]
    return [job["spec"]["template"]]


def secret_values_masked(docs: list[dict]) -> list[dict]:
    """The objects with each Secret's values replaced by their decoded length: every render
    makes a new keeper secret (Helm's randBytes; `helm upgrade` keeps the old one), and nothing
    else of two renders of the same values differs."""
    masked = copy.deepcopy(docs)
    for doc in masked:
        if doc.get("kind") == "Secret":
            data = doc.get("data") or {}
            doc["data"] = {key: f"<{len(base64.b64decode(v))} bytes>" for key, v in data.items()}
    return masked
