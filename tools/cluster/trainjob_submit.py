"""Creating a TrainJob right after the runtime it names (`kubeddp submit`).

Kubeflow Trainer v2.3's TrainJob webhook looks the runtime up in its controller's informer
cache (pkg/runtime/core/trainingruntime.go ValidateObjects), which sees a new object a moment
after the API server has it: a TrainJob created right after its runtime can be refused with
"specified trainingRuntime must be created before the TrainJob is created". submit creates the
runtime first; for a runtime this submission created, that one refusal is retried, with
growing pauses, until RUNTIME_WAIT_SECONDS. A runtime the submission did not create is not
waited for: it is missing, and the refusal says so at once.
"""

from __future__ import annotations

import re
import time

from kubeddp.tools.cluster.kube import Cluster
from kubeddp.tools.cluster.kube_errors import AdmissionRefused, KubeError
from kubeddp.tools.manifests.kinds.trainjob import RESOURCE, RUNTIME_KINDS

RUNTIME_NOT_SEEN = re.compile(
    r"specified (?:trainingRuntime|clusterTrainingRuntime) must be created before the TrainJob "
    r"is created"
)
RUNTIME_WAIT_SECONDS = 30.0  # informer lags are well under a second; a restarting controller is not
FIRST_PAUSE_SECONDS = 0.25
LONGEST_PAUSE_SECONDS = 2.0
DEFAULT_RUNTIME_KIND = RUNTIME_KINDS[0]  # the CRD's default for runtimeRef.kind


def _name(doc: dict) -> object:
    meta = doc.get("metadata")
    return meta.get("name") if isinstance(meta, dict) else None


def runtime_made_here(doc: dict, made: list[dict]) -> dict | None:
    """The runtime object in `made` (this submission's objects so far) that the TrainJob `doc`
    runs on; None for any other object, or a runtime made elsewhere."""
    if (doc.get("apiVersion"), doc.get("kind")) != (RESOURCE.api_version, RESOURCE.kind):
        return None
    spec = doc.get("spec")
    ref = spec.get("runtimeRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict):
        return None
    kind = ref.get("kind") or DEFAULT_RUNTIME_KIND
    for runtime in made:
        if runtime.get("kind") == kind and _name(runtime) == ref.get("name"):
            return runtime
    return None


def create(cluster: Cluster, doc: dict, dry_run: bool, made: list[dict]) -> tuple[dict, str]:
    """Create `doc`: (the API's answer, '' or a note for its line). A TrainJob on a runtime in
    `made` is retried while Trainer's webhook has not seen that runtime yet."""
    runtime = runtime_made_here(doc, made)
    if runtime is None:
        return cluster.create(doc, dry_run=dry_run), ""
    deadline = time.monotonic() + RUNTIME_WAIT_SECONDS
    pause = FIRST_PAUSE_SECONDS
    while True:
        try:
            return cluster.create(doc, dry_run=dry_run), ""
        except AdmissionRefused as refused:
            if not RUNTIME_NOT_SEEN.search(refused.denial):
                raise
            if dry_run:  # the runtime was a dry run too: no webhook can ever see it
                return doc, (
                    f"Trainer's webhook could not check it: its {runtime['kind']} "
                    f"{_name(runtime)} comes with this submission, which a dry run does not create"
                )
            if time.monotonic() + pause > deadline:
                raise KubeError(
                    f"Trainer's webhook still refuses TrainJob {_name(doc)} "
                    f"{RUNTIME_WAIT_SECONDS:g}s after {runtime['kind']} {_name(runtime)} was "
                    "created (its controller does not see it: is it running? kubectl get pods "
                    "-n kubeflow-system); the other objects are created: `kubectl apply -f` of "
                    "the same manifest creates the TrainJob once Trainer sees its runtime"
                ) from None
        time.sleep(pause)
        pause = min(2 * pause, LONGEST_PAUSE_SECONDS)
