"""tests/e2e/kind.sh's waits and checks, sourced with a stand-in `kubectl` on PATH (no cluster
runs here; the kind workflow runs the script for real): a pod that does not exist yet right
after `kubectl apply` is waited for, and a check the job's end made impossible fails instead of
passing vacuously."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)

# Answers `kubectl get pod P -o jsonpath=...phase|uid` and `kubectl get KIND NAME -o ...` from
# files: pod-P (its phase, created after `polls-P` more calls) and conditions.
FAKE_KUBECTL = r"""#!/usr/bin/env bash
state="${FAKE_STATE:?}"
if [ "$1" = get ] && [ "$2" = pod ]; then
  pod="$3"
  if [ -f "${state}/polls-${pod}" ]; then
    left="$(cat "${state}/polls-${pod}")"
    if [ "${left}" -gt 0 ]; then
      echo $((left - 1)) > "${state}/polls-${pod}"
      echo "Error from server (NotFound): pods \"${pod}\" not found" >&2
      exit 1
    fi
  fi
  [ -f "${state}/pod-${pod}" ] || { echo "NotFound" >&2; exit 1; }
  case "$*" in
    *uid*) echo "uid-1" ;;
    *) cat "${state}/pod-${pod}" ;;
  esac
  exit 0
fi
if [ "$1" = get ]; then
  cat "${state}/conditions" 2> /dev/null
  exit 0
fi
echo "unexpected: kubectl $*" >&2
exit 3
"""


def run_helpers(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_STATE": str(tmp_path)}
    return subprocess.run(
        ["bash", "-c", f"source ./kind.sh training-operator && {script}"],
        cwd=REPO / "tests" / "e2e",
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )


def test_a_pod_created_after_apply_is_waited_for(tmp_path: Path) -> None:
    (tmp_path / "pod-job-worker-0").write_text("Running")
    (tmp_path / "polls-job-worker-0").write_text("2")  # NotFound twice, then Running
    done = run_helpers(tmp_path, "wait_pod_running job-worker-0 30 && echo RUNNING")
    assert done.returncode == 0 and "RUNNING" in done.stdout, done.stderr


def test_a_pod_that_never_runs_fails_the_wait(tmp_path: Path) -> None:
    (tmp_path / "pod-job-worker-0").write_text("Pending")
    done = run_helpers(tmp_path, "wait_pod_running job-worker-0 1")
    assert done.returncode == 1 and "not Running after 1s (Pending)" in done.stderr


@pytest.mark.parametrize("condition", ["Succeeded", "Complete", "Failed"])
def test_a_check_the_jobs_end_made_impossible_fails(tmp_path: Path, condition: str) -> None:
    (tmp_path / "conditions").write_text(f"Created Running {condition} ")
    (tmp_path / "pod-job-worker-2").write_text("Running")
    done = run_helpers(tmp_path, "replace_pod job-worker-2 pytorchjob job")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "finished before job-worker-2 could be replaced (not exercised)" in done.stderr


def test_metrics_of_a_finished_job_are_not_exercised(tmp_path: Path) -> None:
    """kubectl exec fails (the pod has ended): the job's end fails the check at once."""
    (tmp_path / "conditions").write_text("Succeeded ")
    done = run_helpers(tmp_path, "assert_metrics job-worker-0 3 pytorchjob job")
    assert done.returncode == 1
    assert "not exercised" in done.stderr and "kubeddp_world_size 3" in done.stderr
