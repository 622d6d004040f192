"""One PodMonitor for the pods of every kubeddp job in a namespace (k8s/podmonitor.yaml).

Not part of any job, so not in the Helm chart (whose PodMonitor selects one job's pods); its
labels, port and target labels come from the same names as the chart's.
"""

from __future__ import annotations

from typing import Any

from kubeddp.tools.manifests import k8s_names as names
from kubeddp.tools.manifests.kinds import KINDS
from kubeddp.tools.manifests.resources import POD_MONITOR


def build_fleet_podmonitor(namespace: str | None = None, extra_labels: dict | None = None) -> dict:
    meta: dict[str, Any] = {"name": names.APP_NAME}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {
        names.LABEL_NAME: names.APP_NAME,
        names.LABEL_MANAGED_BY: names.APP_NAME,
        names.LABEL_COMPONENT: names.METRICS_COMPONENT,
        **(extra_labels or {}),
    }
    target_labels = [names.LABEL_INSTANCE]
    for kind in KINDS.values():
        for label in (kind.job_name_label, *kind.index_labels):
            if label not in target_labels:
                target_labels.append(label)
    selector = {names.LABEL_NAME: names.APP_NAME, names.LABEL_COMPONENT: names.TRAINER_COMPONENT}
    return {
        "apiVersion": POD_MONITOR.api_version,
        "kind": POD_MONITOR.kind,
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector},
            "podTargetLabels": target_labels,
            "podMetricsEndpoints": [{"port": names.METRICS_PORT_NAME, "path": names.METRICS_PATH}],
        },
    }
