"""The storage rules live in one place (trainer/storage_rules.py): a rule changed there
changes what the chart renders (through the _constants.tpl `make chart` writes from it) and what
the trainer does, with no other file touched."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeddp.tools.generate import chart_files as generate
from kubeddp.tools.manifests import helm_engine
from kubeddp.tools.manifests.chart.render import chart_dir
from kubeddp.trainer import storage_rules
from kubeddp.trainer.config import DiagnosticsConfig
from kubeddp.trainer.launcher import stall_watch
from kubeddp.trainer.launcher.retry_budget import RetryBudget
from kubeddp.trainer.worker.checkpoint import CheckpointError, storage_for
from kubeddp.trainer.worker.checkpoint.local import LocalStorage

pytestmark = pytest.mark.timeout(240)

NEW_STORE = "gs://bkt/run"  # a scheme the rules do not name until the test adds it
S3_BACKEND = storage_rules.OBJECT_STORES["s3"][0]


def chart_from_rules(tmp_path: Path) -> Path:
    """A copy of the chart whose _constants.tpl is written from the rules as they are now."""
    copy = tmp_path / "kubeddp"
    shutil.copytree(chart_dir(), copy)
    (copy / "templates" / "_constants.tpl").write_text(generate.constants_tpl())
    return copy


def render(chart: Path, values: dict[str, Any]) -> dict[str, dict]:
    """The chart's objects by resource kind (an IndexedJob: its pod is the plain pod)."""
    values = {"kind": "IndexedJob", "fullnameOverride": "demo", **values}
    rendered = helm_engine.render(chart, values, name="demo", namespace=None)
    docs = [
        doc
        for path, text in rendered.items()
        if path.endswith(".yaml") and "/tests/" not in path  # no NOTES, no `helm test` pod
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return {doc["kind"]: doc for doc in docs}


def checkpoints_volume(job: dict) -> tuple[dict, str]:
    """The pod's checkpoints volume and where the training container mounts it."""
    pod = job["spec"]["template"]["spec"]
    volume = {v["name"]: v for v in pod["volumes"]}["checkpoints"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    return volume, mounts["checkpoints"]


def trainer_sees_object_store(location: str) -> bool:
    """What the trainer decides from the rules for checkpoint.dir `location`: the backend that
    serves it (a directory: LocalStorage; the S3 backend refuses a URL that is not s3://), and
    whether launch keeps its own records (retry budget, stall reports) beside it."""
    try:
        in_a_store = not isinstance(storage_for(location), LocalStorage)
    except CheckpointError as exc:
        assert "not a valid S3 URL" in str(exc)
        in_a_store = True
    budget = RetryBudget(location, limit=5, pod="p").enabled
    reports = stall_watch.report_dir(DiagnosticsConfig(), location) is not None
    assert budget is reports is (not in_a_store), location
    return in_a_store


def test_a_scheme_added_to_the_rules_reaches_the_chart_and_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {"nodes": 2, "config": {"checkpoint": {"dir": NEW_STORE}}}
    before = chart_from_rules(tmp_path / "before")
    with pytest.raises(helm_engine.HelmFailed, match="is not an absolute, clean path"):
        render(before, values)
    assert storage_rules.object_store(NEW_STORE) == ""
    assert not trainer_sees_object_store(NEW_STORE)

    stores = {**storage_rules.OBJECT_STORES, "gs": (S3_BACKEND, "a store added by the test")}
    monkeypatch.setattr(storage_rules, "OBJECT_STORES", stores)

    objects = render(chart_from_rules(tmp_path / "after"), values)
    assert "PersistentVolumeClaim" not in objects and "Deployment" not in objects  # no keeper
    volume, mounted_at = checkpoints_volume(objects["Job"])
    assert volume == {"name": "checkpoints", "emptyDir": {}}  # scratch space only
    assert mounted_at == storage_rules.POD_DIR
    line = objects["Job"]["metadata"]["annotations"]["kubeddp.io/checkpoints"]
    assert line.startswith(f"Checkpoints: {NEW_STORE}, a store added by the test.")
    assert storage_rules.object_store(NEW_STORE) == "gs"
    assert trainer_sees_object_store(NEW_STORE)


def test_a_path_reserved_in_the_rules_is_refused_by_the_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {"config": {"checkpoint": {"dir": "/data/ck"}}}
    volume, mounted_at = checkpoints_volume(render(chart_from_rules(tmp_path / "a"), values)["Job"])
    assert mounted_at == "/data/ck" and "persistentVolumeClaim" in volume
    monkeypatch.setattr(storage_rules, "RESERVED", (*storage_rules.RESERVED, "/data"))
    with pytest.raises(helm_engine.HelmFailed, match="/data/ck would put the checkpoints volume"):
        render(chart_from_rules(tmp_path / "b"), values)
