"""The job kinds kubeddp runs, one module each (like Kubeflow Trainer's plugin per framework).

A kind module defines `KIND = JobKind(...)`: its REST resource, the names its operator uses
(container, pod labels), `takes`: every chart value and where it lands in the kind's objects
(or why the kind refuses or ignores it), how to read its status, and the admission rules its
operator enforces. Its manifest is its template in the Helm chart
(charts/kubeddp/templates/<name>.yaml); the chart reads the facts below from the generated
templates/_constants.tpl. Adding a kind: a module here and a template there, then `make chart`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeddp.tools.manifests.k8s_names import JOB_COMPLETION_INDEX_LABEL
from kubeddp.tools.manifests.patterns import DNS1035
from kubeddp.tools.manifests.resources import Resource

Issue = tuple[str, str]  # (field path, message)


@dataclass(frozen=True)
class Lands:
    """A chart value the kind takes: the objects (by resource kind) that setting it changes."""

    objects: tuple[str, ...]


@dataclass(frozen=True)
class Refused:
    """A chart value the kind cannot take: `kubeddp render` stops with `why` when it is set.
    `by`: the value whose rule refuses it (a section's switch); empty: this value's own rule."""

    why: str
    by: str = ""


@dataclass(frozen=True)
class Ignored:
    """Another kind's setting, read only by that kind's template (its default is not empty, so
    refusing it would refuse every job)."""

    why: str


Takes = Mapping[str, Lands | Refused | Ignored]  # chart value path -> how it lands
# Longest a job name may be so that derived names (<job>-master-0, <job>-config...) stay valid.
MAX_JOB_NAME_LENGTH = 40


@dataclass(frozen=True)
class JobKind:
    name: str  # the CLI's name: `kubeddp render NAME`, `--kind NAME`
    chart_kind: str  # the chart's `kind` value
    position: int  # order in help texts and enums
    help: str
    resource: Resource
    container: str  # the training container, named as the operator expects
    job_name_label: str  # the label the operator puts on the job's pods, value = job name
    index_labels: tuple[str, ...]  # pod labels that tell the job's pods apart
    rendezvous_port: int
    success_conditions: tuple[str, ...]
    replica_lines: Callable[[dict], list[str]]  # status -> lines for `kubeddp status`
    replica_selector: Callable[[str], str]  # `kubeddp logs --replica R` -> label selector
    admission_issues: Callable[[dict], list[Issue]]  # the operator's webhook rules
    # accepted, but likely to fail on some clusters: printed, the manifest is still valid
    warnings: Callable[[dict], list[Issue]] = lambda doc: []
    schema_issues: Callable[[dict], list[Issue]] | None = None  # offline; None: core schemas
    install_hint: str = ""  # how to install the operator (when the API is missing)
    rendezvous_port_name: str = ""  # "" when the runtime, not kubeddp, declares the port
    restart_policies: tuple[str, ...] = ()
    nproc_words: tuple[str, ...] = ("auto", "cpu", "gpu")
    takes: Takes = field(default_factory=dict)  # every chart value but `kind` (tests check)
    companions: tuple[Resource, ...] = ()  # more objects named after the job (deleted with it)
    chart_facts: Mapping[str, Any] = field(default_factory=dict)  # more names its template uses
    # kind auto (the chart's default): the served kind of lowest rank runs; None: picked only
    # when no ranked kind is served (the kind that needs no operator)
    auto_rank: int | None = None
    # (job object, node rank) -> the label selector of that rank's pod (`kubeddp logs
    # --node-rank`); the default: the Job controller's completion index is the node rank
    node_rank_selector: Callable[[dict, int], str] = lambda job, rank: (
        f"{JOB_COMPLETION_INDEX_LABEL}={rank}"
    )

    @property
    def unsupported(self) -> dict[str, str]:
        """The values the chart's own rule refuses for this kind: value path -> why."""
        return {
            path: how.why
            for path, how in self.takes.items()
            if isinstance(how, Refused) and not how.by
        }

    @property
    def declares_ports(self) -> bool:
        return bool(self.rendezvous_port_name)

    @property
    def custom_resource(self) -> bool:
        """An operator's CRD (not a core/batch kind)."""
        return self.resource.group not in ("", "batch")


def mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def sequence(value: Any) -> list:
    """A list field of a manifest, [] when it is something else (the schema reports that)."""
    return value if isinstance(value, list) else []


def name_issues(doc: dict) -> list[Issue]:
    name = mapping(doc.get("metadata")).get("name")
    if not isinstance(name, str) or not DNS1035.match(name) or len(name) > 63:
        return [("metadata.name", f"{name!r} is not {DNS1035.means}, at most 63 characters")]
    return []


def container_names(template: Any) -> list[str]:
    containers = sequence(mapping(mapping(template).get("spec")).get("containers"))
    return [c.get("name") for c in containers if isinstance(c, dict)]


def pod_count_lines(status: dict) -> list[str]:
    counts = ", ".join(
        f"{k}={status.get(k, 0)}" for k in ("active", "ready", "succeeded", "failed")
    )
    return [f"  pods: {counts}"]


def _discover() -> dict[str, JobKind]:
    found = []
    for module in pkgutil.iter_modules(__path__):
        kind = getattr(importlib.import_module(f"{__name__}.{module.name}"), "KIND", None)
        if isinstance(kind, JobKind):
            found.append(kind)
    return {kind.name: kind for kind in sorted(found, key=lambda k: k.position)}


KINDS: dict[str, JobKind] = _discover()
BY_CHART_KIND = {kind.chart_kind: kind for kind in KINDS.values()}
BY_RESOURCE = {kind.resource.key: kind for kind in KINDS.values()}

# The chart's `kind` value that runs the kind the cluster serves, and how it picks: the first
# of AUTO_ORDER whose API the cluster serves (by `auto_rank`: Kubeflow Trainer's, then
# training-operator's), else the last, the kind without a rank (an Indexed Job, whose batch/v1
# API every cluster serves). `helm template` without
# --api-versions sees no operator's API, so it renders the last; so does `kubeddp render`
# without a KIND (it reads no cluster), while `kubeddp submit` asks the cluster (API discovery).
AUTO = "auto"
(OFFLINE_KIND,) = [name for name, kind in KINDS.items() if kind.auto_rank is None]
AUTO_ORDER = (
    *sorted(
        (name for name, kind in KINDS.items() if kind.auto_rank is not None),
        key=lambda name: KINDS[name].auto_rank or 0,
    ),
    OFFLINE_KIND,
)


def pick_kind(served: Callable[[Resource], bool]) -> JobKind:
    """The kind `auto` stands for where `served(resource)` says which APIs the cluster serves."""
    for name in AUTO_ORDER[:-1]:
        if served(KINDS[name].resource):
            return KINDS[name]
    return KINDS[OFFLINE_KIND]
