"""`kubeddp status` shows each pod's progress and verdicts, `kubeddp diagnose` the stall
reports: read from the pods' logs and termination messages against a stand-in API server
(tests/helpers/fake_api.py), with no permission beyond what status and logs need."""

from __future__ import annotations

import copy

import pytest

from tests.helpers.cluster_commands import PODS, PODS_LIST, PYTORCHJOB_STATUS, PYTORCHJOBS, run

pytestmark = pytest.mark.timeout(60)


MASTER_LOG = """\
2026-11-26T10:00:01.123Z step 5/100 | epoch 0 | loss 1.0
2026-11-26T10:00:09.5Z [kubeddp] straggler: rank 1 (pod demo-worker-0, node n2, GPU \
GPU-8d2e6b13-0a5c-4f7e-b3d9-2c4e7f9a1b02) works 2.1x the median
2026-11-26T10:00:10Z step 10/100 | epoch 0 | loss 0.9
"""
WORKER_LOG = """\
2026-11-26T10:04:00Z [kubeddp] progress: rank 1 step 9 data 120 s
2026-11-26T10:05:00Z [kubeddp] ---- stall report begin ----
2026-11-26T10:05:00Z stall report: rank 1 (pod demo-worker-0, node n2) has been in data: x
2026-11-26T10:05:00Z   File "/app/train.py", line 3 in load
2026-11-26T10:05:00Z [kubeddp] ---- stall report end ----
2026-11-26T10:05:00Z [kubeddp] stall: rank 1 (pod demo-worker-0, node n2) has been in data: x \
for 181 s; 1 rank waits in all_reduce #9 (full report: /checkpoints/diagnostics/stall.txt)
2026-11-26T10:05:00Z [kubeddp] stall: ending the workers (diagnostics.on_stall=exit)
"""


def test_status_shows_progress_stragglers_and_the_stall_line(api, capsys):
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    api.route("GET", PODS, 200, PODS_LIST)
    api.route("GET", f"{PODS}/demo-master-0/log", 200, MASTER_LOG)
    api.route("GET", f"{PODS}/demo-worker-0/log", 200, WORKER_LOG)
    code, out, err = run(["status", "demo"], capsys)
    assert code == 0, err
    assert "    step 10/100, last log line 2026-11-26T10:00:10Z" in out
    worker = out.split("demo-worker-0:", 1)[1]
    # the GPU as dcgm-exporter's UUID label names it (the dashboard's GPU panels)
    assert "    straggler: rank 1 (2.1x, GPU GPU-8d2e6b13-0a5c-4f7e-b3d9-2c4e7f9a1b02)" in worker
    assert "    ranks: rank 1 step 9 data 120 s (at 2026-11-26T10:04:00Z)" in worker
    assert "    stall: rank 1 (pod demo-worker-0, node n2) has been in data: x for 181 s" in worker
    assert "(full report: /checkpoints/diagnostics/stall.txt)" in worker
    logs = [c["query"] for c in api.calls("GET") if c["path"].endswith("/log")]
    assert logs and all(q["timestamps"] == "true" and q["tailLines"] == "400" for q in logs)


def test_diagnose_prints_the_reports_and_the_termination_message(api, capsys):
    pods = copy.deepcopy(PODS_LIST)
    pods["items"][0]["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 203, "message": "[kubeddp] stall: rank 0 (pod m) has been in x"}
    }
    api.route("GET", f"{PYTORCHJOBS}/demo", 200, PYTORCHJOB_STATUS)
    api.route("GET", PODS, 200, pods)
    api.route("GET", f"{PODS}/demo-master-0/log", 200, MASTER_LOG)
    api.route("GET", f"{PODS}/demo-worker-0/log", 200, WORKER_LOG)
    code, out, err = run(["diagnose", "demo"], capsys)
    assert code == 0, err
    assert "==== demo-worker-0 ====\nstall report: rank 1" in out
    assert '  File "/app/train.py", line 3 in load' in out
    assert "==== demo-master-0 (termination message) ====\nstall: rank 0 (pod m)" in out


def test_diagnose_without_a_report_says_where_reports_stay(api, capsys):
    api.route("GET", PODS, 200, PODS_LIST)  # --kind given: the job itself is not read
    api.route("GET", f"{PODS}/demo-master-0/log", 200, MASTER_LOG)
    api.route("GET", f"{PODS}/demo-worker-0/log", 200, "")
    code, out, _ = run(["diagnose", "demo", "--kind", "pytorchjob"], capsys)
    assert code == 1
    assert "no stall report" in out and "diagnostics.report_dir" in out
