"""The built wheel in a clean venv (no system site-packages), as a user installs it:
- what each extra adds on disk, beyond torch, is at most what docs/install.md states;
- with `[cli]`, `kubeddp render` and `validate` work offline through a helm binary on PATH;
  with `[cli,helm]` through the library and no binary; with neither, one line and exit 2;
- every cluster command (status, logs, logs -f, wait, submit -f, render validating against the
  cluster's CRD, delete) works against the fake API server: with `[cli]` through kubectl on
  PATH, with `[cli,kube]` through the newest kubernetes client pip resolves and through the
  oldest client and urllib3 the `kube` extra declares, with `[sdk]` (a client below 36) too;
  with neither kubectl nor the client, one line and exit 2;
- `[sdk]` validates with the Kubeflow SDK models; `[s3]` installs; `[tensorboard]` stays within
  its documented size;
- the metrics work with the newest prometheus-client pip resolves and with its lower bound
  (tests/helpers/metrics_probe.py);
- `kubeddp --version` is the package version;
- pip keeps a torch newer than any kubeddp was tested with (a stand-in distribution named torch,
  version 2.99.0): installing kubeddp beside it, or both in one command, never replaces it.

The tests share one venv and run in file order: the `[cli]` ones first, then the ones that
add an extra (`kube`, then `helm`, `sdk`, `s3`) to it. Nothing uses a lock: pip resolves the
newest releases the wheel's requirements allow, as a user's `pip install` does.

torch is not installed (it is the trainer's dependency, 750 MiB, and the same for every extra):
kubeddp goes in with --no-deps and its other requirements are installed from the wheel's
metadata. PyPI must be reachable (a skip says so otherwise; CI fails instead).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from kubeddp.trainer import __version__
from tests.helpers import fake_api, helm_cli, reference

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "install.md"
MIB = 1 << 20

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _pypi_reachable() -> None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/jsonschema/", timeout=10).close()
    except OSError as exc:
        reason = f"PyPI is not reachable ({exc}); this test installs from it"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def documented_sizes() -> dict[str, int]:
    """docs/install.md's table: `| \\`pip install kubeddp[cli]\\` | ... | NN MiB |` rows."""
    rows = re.findall(r"^\| `pip install (kubeddp(?:\[[a-z,]+\])?)` \|.*\| (\d+) MiB \|$",
                      DOC.read_text(), re.MULTILINE)  # fmt: skip
    return {name: int(size) for name, size in rows}


def _requirements(wheel: Path, extras: set[str]) -> list[str]:
    """The wheel's Requires-Dist for these extras, torch left out."""
    (meta,) = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA")]
    out = []
    for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement, _, marker = line.removeprefix("Requires-Dist: ").partition(";")
        extra = re.search(r'extra == "([^"]+)"', marker)
        if (extra is None or extra.group(1) in extras) and not requirement.startswith("torch"):
            out.append(requirement.strip())
    return out


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--wheel-dir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("kubeddp-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> dict:
    """A clean venv: sizes and times of kubeddp, then of [cli] added to it."""
    _pypi_reachable()
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    site = next(root.glob("lib/python*/site-packages"))
    measured, seconds = {}, {}
    empty = _size(site)
    for name, extras in (("kubeddp", set()), ("kubeddp[cli]", {"cli"})):
        started = time.monotonic()
        subprocess.run([*pip, "--no-deps", str(wheel)], check=True, timeout=300)
        subprocess.run([*pip, *_requirements(wheel, extras)], check=True, timeout=600)
        seconds[name] = time.monotonic() - started
        measured[name] = _size(site) - empty
    _report(measured, seconds)
    return {"root": root, "sizes": measured, "pip": pip, "wheel": wheel, "empty": empty}


def _report(sizes: dict[str, int], seconds: dict[str, float]) -> None:
    print(f"\ninstall beyond torch: { {k: f'{v / MIB:.1f} MiB' for k, v in sizes.items()} }")
    print(f"install time (network included): { {k: f'{v:.1f} s' for k, v in seconds.items()} }")


def _within_documented(sizes: dict[str, int]) -> None:
    stated = documented_sizes()
    for name, size in sizes.items():
        assert name in stated, f"docs/install.md has no row for {name}"
        assert size <= stated[name] * MIB, f"{name}: {size / MIB:.1f} MiB > {stated[name]} MiB"


def test_each_extra_stays_within_its_documented_size(venv: dict) -> None:
    _within_documented(venv["sizes"])


def _kubeddp(venv: dict, path: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": str(cwd), "KUBECONFIG": str(cwd / "none")}
    return subprocess.run(
        [str(venv["root"] / "bin" / "kubeddp"), *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def _render_and_validate(venv: dict, path: str, tmp_path: Path) -> None:
    for kind in ("pytorchjob", "trainjob", "indexedjob"):
        done = _kubeddp(venv, path, "render", kind, "--nodes", "2", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        (tmp_path / f"{kind}.yaml").write_text(done.stdout)
        checked = _kubeddp(venv, path, "validate", f"{kind}.yaml", cwd=tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    bad = (tmp_path / "pytorchjob.yaml").read_text().replace("replicas:", "replicaz:", 1)
    (tmp_path / "bad.yaml").write_text(bad)
    refused = _kubeddp(venv, path, "validate", "bad.yaml", cwd=tmp_path)
    assert refused.returncode == 1 and "replicaz" in refused.stdout, refused.stdout


def test_version(venv: dict, tmp_path: Path) -> None:
    done = _kubeddp(venv, "/usr/bin:/bin", "--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"kubeddp {__version__}"


def test_cli_renders_and_validates_with_the_helm_binary(venv: dict, tmp_path: Path) -> None:
    helm = helm_cli.require(helm_cli.HELM_3, "helm")
    _render_and_validate(venv, f"{helm.parent}:/usr/bin:/bin", tmp_path)


def test_cli_without_any_helm_says_what_to_install(venv: dict, tmp_path: Path) -> None:
    done = _kubeddp(venv, "/usr/bin:/bin", "render", "pytorchjob", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "install the helm binary" in line and "pip install 'kubeddp[helm]'" in line


def _client_importable(venv: dict) -> bool:
    python = str(venv["root"] / "bin" / "python")
    found = subprocess.run([python, "-c", "import kubernetes"], capture_output=True, timeout=60)
    return found.returncode == 0


NS = fake_api.NAMESPACE
JOB_PATH = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/demo"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org"
# Each cluster command, as a user types it (render and submit validate by default: `auto`).
CLUSTER_COMMANDS = (
    ("status", "demo"),
    ("logs", "demo", "--tail", "5"),
    ("logs", "demo", "--follow"),
    ("wait", "demo", "--timeout", "10s"),
    ("submit", "-f", "cm.yaml"),
    ("render", "pytorchjob", "--nodes", "2"),  # reads the PyTorchJob CRD from the cluster
    ("delete", "demo"),
)


def _cluster(api: fake_api.FakeApiServer, tmp_path: Path) -> None:
    """A finished PyTorchJob with one pod, its CRD, and what submit and delete send."""
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "demo"},
           "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}  # fmt: skip
    pod = {"metadata": {"name": "demo-worker-0", "uid": "u"}, "status": {"phase": "Succeeded"}}
    api.route("GET", JOB_PATH, 200, job)
    api.route("GET", f"/api/v1/namespaces/{NS}/pods", 200,
              {"kind": "PodList", "apiVersion": "v1", "items": [pod]})  # fmt: skip
    api.route("GET", f"/api/v1/namespaces/{NS}/pods/demo-worker-0/log", 200, "step 1\n")
    api.route("DELETE", JOB_PATH, 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
    api.route("POST", f"/api/v1/namespaces/{NS}/configmaps", 201)
    crd = reference.read_text(reference.CRDS / "kubeflow.org_pytorchjobs.v1.9.4.yaml")
    api.route("GET", CRD_PATH, 200, yaml.safe_load(crd))
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(config_map))


def _run_cluster_commands(venv: dict, path: str, tmp_path: Path) -> None:
    """Every cluster command through the venv's transport against the fake API server: each
    ends 0, every request carries the kubeconfig's token, and render read the cluster's CRD."""
    with fake_api.running(tmp_path) as api:  # HTTPS: kubectl sends the token only so
        _cluster(api, tmp_path)
        kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", api.url, api.ca_pem)
        for argv in CLUSTER_COMMANDS:
            done = _kubeddp(venv, path, *argv, "--kubeconfig", str(kubeconfig), cwd=tmp_path)
            assert done.returncode == 0, f"kubeddp {' '.join(argv)}: {done.stderr}"
            if argv[0] == "logs":
                assert done.stdout == "[demo-worker-0] step 1\n", done.stdout
        assert all(r["authorization"] == f"Bearer {fake_api.TOKEN}" for r in api.requests)
        assert CRD_PATH in [r["path"] for r in api.requests], "render did not read the CRD"


def test_cli_cluster_commands_work_through_kubectl(venv: dict, tmp_path: Path) -> None:
    assert not _client_importable(venv), "the [cli] venv has the client: run in file order"
    kubectl = helm_cli.require(helm_cli.KUBECTL, "kubectl")
    helm = helm_cli.require(helm_cli.HELM_3, "helm")
    _run_cluster_commands(venv, f"{kubectl.parent}:{helm.parent}:/usr/bin:/bin", tmp_path)


def test_cli_without_kubectl_or_client_says_what_to_install(venv: dict, tmp_path: Path) -> None:
    assert not _client_importable(venv), "the [cli] venv has the client: run in file order"
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:9")
    empty = tmp_path / "bin"  # PATH with no kubectl (the machine's own may be in /usr/bin)
    empty.mkdir()
    done = _kubeddp(venv, str(empty), "status", "demo", "--kubeconfig", str(kubeconfig),
                    cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "install kubectl" in line and "pip install 'kubeddp[kube]'" in line, line


def test_tensorboard_extra_stays_within_its_documented_size(venv: dict) -> None:
    """[tensorboard] on top of kubeddp (installed before the extras below bring packages it
    shares); its reader imports (the writer needs torch, which this venv leaves out)."""
    site = next(venv["root"].glob("lib/python*/site-packages"))
    before = _size(site)
    subprocess.run([*venv["pip"], *_requirements(venv["wheel"], {"tensorboard"})], check=True,
                   timeout=600)  # fmt: skip
    added = _size(site) - before
    print(f"\n[tensorboard] adds {added / MIB:.1f} MiB: {_versions(venv, 'tensorboard')}")
    _within_documented({"kubeddp[tensorboard]": venv["sizes"]["kubeddp"] + added})
    reader = "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator"
    subprocess.run([str(venv["root"] / "bin" / "python"), "-c", reader], check=True, timeout=120)


def test_kube_extra_stays_within_its_documented_size(venv: dict) -> None:
    """[cli,kube]: the client on top of [cli], for machines without kubectl (what it adds to
    this venv, which may already hold the tensorboard extra's packages)."""
    site = next(venv["root"].glob("lib/python*/site-packages"))
    before = _size(site)
    started = time.monotonic()
    subprocess.run([*venv["pip"], *_requirements(venv["wheel"], {"cli", "kube"})], check=True,
                   timeout=600)  # fmt: skip
    sizes = {"kubeddp[cli,kube]": venv["sizes"]["kubeddp[cli]"] + _size(site) - before}
    _report(sizes, {"kubeddp[cli,kube]": time.monotonic() - started})
    _within_documented(sizes)
    assert _client_importable(venv)


def _versions(venv: dict, *names: str) -> dict[str, str]:
    python = str(venv["root"] / "bin" / "python")
    code = (
        "import sys; from importlib import metadata; "
        "print(*(metadata.version(n) for n in sys.argv[1:]))"
    )
    done = subprocess.run([python, "-c", code, *names], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return dict(zip(names, done.stdout.split(), strict=True))


def _lower_bound(wheel: Path, extras: set[str], name: str) -> str:
    """The version a requirement of the wheel's metadata starts at (`name>=X,...`)."""
    (requirement,) = [r for r in _requirements(wheel, extras) if r.startswith(name)]
    return re.search(r">=([\w.]+)", requirement).group(1)  # type: ignore[union-attr]


def test_kube_extra_runs_the_cluster_commands_with_the_newest_client(
    venv: dict, tmp_path: Path
) -> None:
    """What pip resolves for [cli,kube] today (kubernetes 37 changed ApiClient.call_api)."""
    helm = helm_cli.require(helm_cli.HELM_3, "helm")
    print(f"\nnewest resolved: {_versions(venv, 'kubernetes', 'urllib3')}")
    _run_cluster_commands(venv, f"{helm.parent}:/usr/bin:/bin", tmp_path)


def test_the_oldest_client_the_kube_extra_declares(venv: dict, tmp_path: Path) -> None:
    helm = helm_cli.require(helm_cli.HELM_3, "helm")
    oldest = {
        name: _lower_bound(venv["wheel"], {"kube"}, name) for name in ("kubernetes", "urllib3")
    }
    pins = [f"{name}=={version}" for name, version in oldest.items()]
    subprocess.run([*venv["pip"], *pins], check=True, timeout=600)
    installed = _versions(venv, *oldest)
    assert {n: Version(v) for n, v in installed.items()} == {
        n: Version(v) for n, v in oldest.items()
    }, installed
    _run_cluster_commands(venv, f"{helm.parent}:/usr/bin:/bin", tmp_path)


def test_helm_extra_renders_without_the_binary(venv: dict, tmp_path: Path) -> None:
    subprocess.run([*venv["pip"], *_requirements(venv["wheel"], {"helm"})], check=True, timeout=600)
    _render_and_validate(venv, "/usr/bin:/bin", tmp_path)


def test_sdk_extra_validates_with_the_kubeflow_models(venv: dict, tmp_path: Path) -> None:
    """[sdk] brings the Kubeflow SDK models (and, with kubeflow-training, a client below 36):
    offline validation walks them, and the cluster commands still work with that client."""
    newest = ["--upgrade", "--upgrade-strategy", "eager"]  # not the oldest client of above
    subprocess.run([*venv["pip"], *newest, *_requirements(venv["wheel"], {"sdk"})], check=True,
                   timeout=600)  # fmt: skip
    print(f"\nsdk resolved: {_versions(venv, 'kubeflow-training', 'kubernetes')}")
    _render_and_validate(venv, "/usr/bin:/bin", tmp_path)  # the helm extra renders
    _run_cluster_commands(venv, "/usr/bin:/bin", tmp_path)


def test_s3_extra_installs_its_client(venv: dict) -> None:
    """[s3] resolves and imports; its checkpoints need torch, so they are tested in the dev
    venv (tests/integration/test_checkpoint_s3_runs.py, newest boto3 there too)."""
    subprocess.run([*venv["pip"], *_requirements(venv["wheel"], {"s3"})], check=True,
                   timeout=600)  # fmt: skip
    print(f"\ns3 resolved: {_versions(venv, 'boto3')}")


def test_metrics_with_the_newest_and_the_oldest_prometheus_client(
    venv: dict, tmp_path: Path
) -> None:
    """The newest prometheus-client pip resolves (kubeddp sets no upper bound: it uses only
    the public API), then the lower bound."""
    python = str(venv["root"] / "bin" / "python")
    probe = str(REPO / "tests" / "helpers" / "metrics_probe.py")
    oldest = _lower_bound(venv["wheel"], set(), "prometheus-client")
    for pin in ([], [f"prometheus-client=={oldest}"]):
        if pin:
            subprocess.run([*venv["pip"], *pin], check=True, timeout=600)
        done = subprocess.run([python, probe], capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0 and done.stdout.startswith("ok "), done.stderr
        print(f"\nmetrics probe: {done.stdout.strip()}")
    assert Version(done.stdout.split()[1]) == Version(oldest), done.stdout


# --- a newer torch stays ----------------------------------------------------------------------

STAND_IN_TORCH = "2.99.0"  # newer than any torch release: what a cap on torch would refuse


def _stand_in_torch_wheel(folder: Path) -> Path:
    """A wheel named torch, version STAND_IN_TORCH, holding one module: pip sees a torch
    distribution, and nothing real is ever downloaded or installed."""
    name = f"torch-{STAND_IN_TORCH}"
    files = {
        "torch/__init__.py": f'__version__ = "{STAND_IN_TORCH}"\n',
        f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: "
        f"{STAND_IN_TORCH}\n",
        f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: kubeddp-tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{name}.dist-info/RECORD,,")
    files[f"{name}.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel_path = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(wheel_path, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel_path


# pip as a user runs it, but with none of this machine's pip settings: its config files name a
# folder of local torch wheels and a constraints file that caps torch (PIP_CONSTRAINT,
# /etc/xdg/pip/constraints.txt), which would make pip replace the stand-in for a reason that
# is not kubeddp's.
OFFLINE_PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_CONSTRAINT": "", "PIP_FIND_LINKS": "",
                   "PIP_EXTRA_INDEX_URL": "", "PIP_INDEX_URL": ""}  # fmt: skip


def _pip(python: Path | str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **OFFLINE_PIP_ENV, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run([str(python), "-m", "pip", *argv], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def offline_index(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A folder pip installs from with --no-index: kubeddp's wheel, its requirements but torch
    (downloaded from PyPI once), and the stand-in torch. No real torch is in it, so a resolver
    that wanted another torch fails here instead of downloading one."""
    _pypi_reachable()
    folder = tmp_path_factory.mktemp("offline-index")
    done = _pip(sys.executable, "download", "--quiet", "--dest", str(folder),
                *_requirements(wheel, set()))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list(folder.glob("torch-*")), "a real torch was downloaded"
    (folder / wheel.name).write_bytes(wheel.read_bytes())
    _stand_in_torch_wheel(folder)
    return folder


def _fresh_venv(root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    return root / "bin" / "python"


def _torch_version(python: Path) -> str:
    done = _pip(python, "show", "torch")
    found = re.search(r"^Version: (\S+)$", done.stdout, re.M)
    assert found, done.stdout + done.stderr
    return found.group(1)


@pytest.mark.parametrize("how", ["kubeddp beside it", "both in one command"])
def test_pip_keeps_a_torch_newer_than_any_tested(
    how: str, offline_index: Path, tmp_path: Path
) -> None:
    """`pip install kubeddp` where torch 2.99.0 is installed, and `pip install torch==2.99.0
    kubeddp`: pip resolves kubeddp's torch requirement with 2.99.0 and keeps it (a cap such as
    <2.15 made the first replace torch with a multi-GB download of another build and the
    second ResolutionImpossible)."""
    python = _fresh_venv(tmp_path / "venv")
    offline = ["install", "--no-index", "--find-links", str(offline_index)]
    if how == "kubeddp beside it":
        done = _pip(python, *offline, "--no-deps", f"torch=={STAND_IN_TORCH}")
        assert done.returncode == 0, done.stderr[-2000:]
        done = _pip(python, *offline, "kubeddp")
    else:
        done = _pip(python, *offline, f"torch=={STAND_IN_TORCH}", "kubeddp")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _torch_version(python) == STAND_IN_TORCH
    installed = re.search(r"^Successfully installed (.*)$", done.stdout, re.M)
    assert installed and "kubeddp-" in installed.group(1), done.stdout
    if how == "kubeddp beside it":
        assert "torch-" not in installed.group(1), f"pip reinstalled torch: {installed.group(0)}"
