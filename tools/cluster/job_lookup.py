"""Which kind of job a name belongs to: `kubeddp status/logs/wait/delete NAME` look for it among
every kind kubeddp runs, so a TrainJob is found without `--kind trainjob`."""

from __future__ import annotations

from dataclasses import dataclass

from kubeddp.tools.cluster.kube import Cluster
from kubeddp.tools.cluster.kube_errors import KubeError, KubeInputError
from kubeddp.tools.manifests.kinds import KINDS, JobKind

NOT_FOUND = 404  # the object, or the API of its kind (no operator installed), is not there


@dataclass(frozen=True)
class FoundJob:
    kind: JobKind
    job: dict  # the job object as the API server answered


def find_job(cluster: Cluster, name: str, kind_name: str | None = None) -> FoundJob:
    """The job named `name`, of `kind_name` or else of whichever kind has one by that name."""
    if kind_name is not None:
        kind = KINDS[kind_name]
        return FoundJob(kind, cluster.get(kind.resource, name))
    found, missing = [], []
    for kind in KINDS.values():
        try:
            found.append(FoundJob(kind, cluster.get(kind.resource, name)))
        except KubeError as exc:
            if exc.status != NOT_FOUND:
                if exc.status == 403:
                    raise KubeError(f"{exc} (or pass --kind KIND)", exc.status) from None
                raise
            missing.append(exc)
    if len(found) == 1:
        return found[0]
    if found:
        kinds = " and a ".join(f.kind.resource.kind for f in found)
        choices = " or ".join(f"--kind {f.kind.name}" for f in found)
        raise KubeInputError(
            f"{name!r} names a {kinds} in namespace {cluster.namespace!r}; pass {choices}"
        )
    namespace_gone = [exc for exc in missing if str(exc).startswith("namespace ")]
    if namespace_gone:
        raise namespace_gone[0]
    looked = ", ".join(kind.resource.kind for kind in KINDS.values())
    raise KubeError(
        f"no job named {name!r} in namespace {cluster.namespace!r} (looked for a {looked}); "
        "check the name and -n (kubectl get pytorchjobs,trainjobs,jobs lists them)",
        NOT_FOUND,
    )
