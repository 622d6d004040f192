"""What tests/e2e/kind.sh sends to the cluster, checked here without one: each leg runs with
stand-in `kubectl` and `helm` that record their calls (its waits and log checks, tested in
test_kind_script.py, do nothing), the real `kubeddp render`, then

- every `helm install` of the chart is rendered by the real helm binary with the same options
  and installed in Helm's order through Trainer v2.3's webhook (tests/helpers/helm_install.py):
  every kind of the chart is installed by some leg, and admitted;
- every `kubectl apply -f` of a rendered job is admitted; the stand-in refuses the first apply
  of a file with a TrainJob as a lagging Trainer cache would, so a leg that does not apply it
  again fails;
- the webhook probe (a server dry run) can pass: it renders, and the TrainJob in it runs on a
  runtime that exists (a dry-run runtime beside it never would).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import helm_cli, helm_install
from tests.helpers.admission import Refused, with_trainer

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)
LEGS = ("leg_training_operator", "leg_trainer", "leg_indexedjob")
TRAINER_REFUSAL = (
    'Error from server (Forbidden): admission webhook "validator.trainjob.trainer.kubeflow.org" '
    "denied the request: ... specified trainingRuntime must be created before the TrainJob is "
    "created"
)

# Records each call's arguments, one file per call (NUL-separated), and copies the file an
# `apply -f FILE` names; refuses the first apply of a file that holds a TrainJob.
FAKE_KUBECTL = r"""#!/usr/bin/env bash
state="${FAKE_STATE:?}"
n="$(ls "${state}/calls" | wc -l)"
printf '%s\0' kubectl "$@" > "${state}/calls/$(printf '%04d' "${n}")"
file="${*: -1}"
if [ "$1" = apply ] && [ -f "${file}" ]; then
  cp "${file}" "${state}/calls/$(printf '%04d' "${n}").yaml"
  case " $* " in *" --dry-run=server "*) exit 0 ;; esac
  if grep -q '^kind: TrainJob$' "${file}" && [ ! -e "${file}.refused" ]; then
    touch "${file}.refused"
    echo "REFUSAL" >&2
    exit 1
  fi
fi
exit 0
""".replace("REFUSAL", TRAINER_REFUSAL)
FAKE_HELM = r"""#!/usr/bin/env bash
state="${FAKE_STATE:?}"
n="$(ls "${state}/calls" | wc -l)"
printf '%s\0' helm "$@" > "${state}/calls/$(printf '%04d' "${n}")"
"""
# What the legs wait for and read from a running cluster: not here.
NO_CLUSTER = (
    "wait_job", "assert_trained", "assert_resumed", "assert_metrics", "wait_pod_running",
    "replace_pod", "lose_rank0_pod", "assert_kind_auto",
)  # fmt: skip


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[list[str], Path | None]]:
    """Each call of the three legs: its arguments, and the file it applied (or None)."""
    work = tmp_path_factory.mktemp("kind")
    bin_dir, state = work / "bin", work / "state"
    (state / "calls").mkdir(parents=True)
    bin_dir.mkdir()
    for name, text in (("kubectl", FAKE_KUBECTL), ("helm", FAKE_HELM)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_STATE": str(state),
        "KIND_WORK_DIR": str(work),
        "RETRY_PAUSE": "0",
        "KUBEDDP": str(Path(sys.executable).with_name("kubeddp")),
        "KUBEDDP_HELM": "library",  # `helm` on PATH is the stand-in
    }
    script = "; ".join(
        ["source tests/e2e/kind.sh trainer", *(f"{f}() {{ :; }}" for f in NO_CLUSTER), *LEGS]
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = []
    for path in sorted((state / "calls").iterdir()):
        if path.suffix != ".yaml":
            applied = path.with_name(path.name + ".yaml")
            argv = path.read_text().split("\0")[:-1]
            recorded.append((argv, applied if applied.is_file() else None))
    return recorded


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _chart_installs(calls: list[tuple[list[str], Path | None]]) -> list[list[str]]:
    return [argv[2:] for argv, _ in calls if argv[:2] == ["helm", "install"]]


def test_every_kind_of_the_chart_is_installed_by_helm_and_admitted(calls, tmp_path) -> None:
    binary = helm_cli.require(helm_cli.HELM_3_OLDEST, "helm")  # the workflow's Helm 3.16
    installed = set()
    for options in _chart_installs(calls):
        assert options[1] == "charts/kubeddp", options
        done = subprocess.run(
            [str(binary), "template", *options], cwd=REPO, capture_output=True, text=True,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"helm template {options}: {done.stderr}"
        docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
        api = with_trainer()
        helm_install.install(api, helm_install.from_documents(docs))
        installed |= {kind for kind in api.created_kinds()}
    assert {"PyTorchJob", "TrainJob", "Job"} <= installed


def test_every_applied_job_is_admitted_and_a_refused_trainjob_applied_again(calls) -> None:
    applies = [(argv, path) for argv, path in calls if argv[:2] == ["kubectl", "apply"] and path]
    files = [path for argv, path in applies if "--dry-run=server" not in argv]
    assert files, "no kubectl apply recorded"
    trainjob_files = [p for p in files if any(d["kind"] == "TrainJob" for d in _documents(p))]
    for path in files:
        assert helm_install.kubectl_apply(with_trainer(), _documents(path)) == [], path
    names = [argv[-1] for argv, path in applies if path in trainjob_files]
    assert names and all(names.count(name) == 2 for name in names), names  # refused, again


def test_the_webhook_probe_can_pass_a_server_dry_run(calls) -> None:
    probes = [path for argv, path in calls if argv[:2] == ["kubectl", "apply"] and path
              and "--dry-run=server" in argv and "probe" in argv[-1]]  # fmt: skip
    assert probes, "the trainer leg's webhook probe was not applied"
    for path in probes:
        api = with_trainer()
        for doc in _documents(path):
            try:
                api.create(doc, dry_run=True)
            except Refused as refused:
                pytest.fail(f"{doc['kind']} of the probe: {refused.message}")


def _mounted_secrets(node: object) -> set[str]:
    """Every Secret a volume in `node` names."""
    if isinstance(node, dict):
        found = {str(node["secretName"])} if "secretName" in node else set()
        return found.union(*(_mounted_secrets(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_mounted_secrets(item) for item in node))
    return set()


def test_every_secret_an_applied_job_mounts_is_made_before_it(calls) -> None:
    """A file that names the keeper's Secret without carrying it (k8s/ holds no secret: anyone
    may read it) must have it made first, or its pods wait for it forever."""
    made: set[str] = set()
    checked = 0
    for argv, path in calls:
        if argv[:4] == ["kubectl", "create", "secret", "generic"]:
            made.add(argv[4])
        path = path or (REPO / argv[-1] if (REPO / argv[-1]).is_file() else None)  # k8s/...
        if argv[:2] == ["kubectl", "apply"] and path and "--dry-run=server" not in argv:
            docs = _documents(path)
            carried = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
            missing = _mounted_secrets(docs) - carried - made
            assert not missing, f"{argv[-1]} mounts {sorted(missing)}, made by nobody before"
            checked += bool(_mounted_secrets(docs) - carried)
    assert checked, "no applied file names a Secret it does not carry (k8s/ should)"
