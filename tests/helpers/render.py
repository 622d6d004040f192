"""Render a job the way `kubeddp render KIND ...` does, as objects (no printing, no validation)."""

from __future__ import annotations

from kubeddp.tools.chart.render import render_documents
from kubeddp.tools.chart.render_options import values_from_args
from kubeddp.tools.cli import parse_command


def render_job(*argv: str) -> list[dict]:
    """`render_job("pytorchjob", "--nodes", "2")`: the objects in apply order."""
    args = parse_command(["render", *argv])
    return render_documents(*values_from_args(args))


def job_of(*argv: str) -> dict:
    """The job object (PyTorchJob, TrainJob or batch/v1 Job) of a render."""
    (job,) = [d for d in render_job(*argv) if d["kind"] in ("PyTorchJob", "TrainJob", "Job")]
    return job
