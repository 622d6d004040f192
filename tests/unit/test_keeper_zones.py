"""The keeper's zone line: render (the class unread) and submit (the class read through the fake
API server) say what a zonal disk costs on node loss and name the zone-redundant classes; a
zone-redundant or shared class says nothing."""

from __future__ import annotations

import pytest

from kubeddp.tools.cluster.keeper_zones import (
    EVICTION_SECONDS,
    FORCE_DETACH_SECONDS,
    zone_line,
    zone_redundant,
)
from kubeddp.tools.cluster.storage_classes import ClaimNeed
from tests.helpers.cluster_commands import (
    KEEPER_JOB_COMPANIONS,
    PYTORCHJOBS,
    STORAGE_CLASSES,
    run,
)

CLAIM = ClaimNeed("demo-checkpoints", "", ("ReadWriteOnce",))
OPTIONS = ("regional-pd", "Premium_ZRS", "StandardSSD_ZRS", "EBS has none", "s3://")


def _class(name: str, provisioner: str, default: bool = True, **parameters: str) -> dict:
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"metadata": {"name": name, "annotations": annotations},
            "provisioner": provisioner, "parameters": parameters}  # fmt: skip


def test_the_numbers_are_the_kubernetes_defaults() -> None:
    # DefaultTolerationSeconds admission plugin; attach/detach DefaultTimerConfig
    assert (EVICTION_SECONDS, FORCE_DETACH_SECONDS) == (300, 360)


@pytest.mark.parametrize(
    ("storage_class", "says"),
    [
        (_class("gp3", "ebs.csi.aws.com"), "a zonal disk: after the keeper's node is lost"),
        (_class("standard-rwo", "pd.csi.storage.gke.io", type="pd-balanced"), "a zonal disk"),
        (_class("managed-csi", "disk.csi.azure.com", skuName="StandardSSD_LRS"), "a zonal disk"),
        (_class("standard", "rancher.io/local-path"), "lost with that node"),
        (_class("fast", "example.com/unknown"), "not one kubeddp knows to be zonal"),
        (_class("regional", "pd.csi.storage.gke.io", **{"replication-type": "regional-pd"}), None),
        (_class("zrs", "disk.csi.azure.com", skuname="Premium_ZRS"), None),
        (_class("efs", "efs.csi.aws.com"), None),
    ],
)
def test_a_class_is_said_by_what_it_costs_on_node_loss(storage_class: dict, says) -> None:
    line = zone_line(CLAIM, storage_class)
    if says is None:
        assert line is None, line
        assert zone_redundant(storage_class) or storage_class["provisioner"] == "efs.csi.aws.com"
        return
    assert line is not None and says in line, line
    assert all(option in line for option in OPTIONS), line
    if "zonal disk" in says:
        assert "300 s" in line and "6 min" in line and "11 min or more" in line, line


def test_render_says_the_unread_class_and_submit_the_one_it_read(api, capsys) -> None:
    code, _, err = run(["render", "pytorchjob", "--name", "demo", "--nodes", "2",
                        "--validate-against", "offline"], capsys)  # fmt: skip
    assert code == 0, err
    (line,) = [line for line in err.splitlines() if "zones:" in line]
    assert "claim demo-checkpoints uses StorageClass (the cluster default), not read" in line
    code, _, err = run(["render", "pytorchjob", "--name", "one", "--nodes", "1",
                        "--validate-against", "offline"], capsys)  # fmt: skip
    assert code == 0 and "zones:" not in err, err  # one pod mounts its claim: no keeper
    classes = [
        _class("gp3", "ebs.csi.aws.com"),
        _class("regional", "pd.csi.storage.gke.io", False, **{"replication-type": "regional-pd"}),
    ]
    listed = {"kind": "StorageClassList", "apiVersion": "storage.k8s.io/v1", "items": classes}
    api.route("GET", STORAGE_CLASSES, 200, listed)
    for path in (PYTORCHJOBS, *KEEPER_JOB_COMPANIONS):
        api.route("POST", path, 201)
    submit = ["submit", "pytorchjob", "--nodes", "2", "--validate-against", "offline"]
    code, _, err = run([*submit, "--name", "demo"], capsys)
    assert code == 0, err
    (line,) = [line for line in err.splitlines() if "zones:" in line]
    assert line.startswith("kubeddp submit: zones: the keeper's claim demo-checkpoints uses "
                           "StorageClass gp3 (ebs.csi.aws.com), a zonal disk"), line  # fmt: skip
    code, _, err = run([*submit, "--name", "b", "--storage-class", "regional"], capsys)
    assert code == 0 and "zones:" not in err, err
