"""The README's commands, in the order a reader meets them, in one fresh copy of the repository:
its tracked files as they are now, with this machine's `.venv` (the one `make setup` made; a
copy keeps the files' times, so make finds the set-up done, as it is for the reader after
`make demo`). Each command runs as written, through bash, after the `. .venv/bin/activate`
the README says. Those that need a cluster, docker, a registry or a second host are skipped
with their reason, one test each, so a reader's path never skips silently; a README command
the table below does not know fails the test until someone says what it needs.

`make demo` once wrote its checkpoints into `checkpoints/demo`, and the README's next training
command then refused `checkpoints/` (it held something kubeddp did not write there).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import procs
from tests.helpers.readme import README, lines_and_fences

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
COMMAND_SECONDS = 600  # make demo: 440 steps, about 40 s on 2 idle cores

CLUSTER = "needs a Kubernetes cluster (the kind workflow runs the jobs; tests/emulation here)"
DOCKER = "needs docker and the image (tests/e2e builds and runs it)"
REGISTRY = "needs the release registry (ghcr.io); this machine reaches none"
PIP = "installs from a git URL the README leaves to the reader (tests/integration/test_install.py "
PIP += "installs the built wheel with each extra in a clean venv)"
# Every command of the README's ```sh blocks, as written (a `# comment` dropped, a `\`
# continuation joined), and None to run it or why it is skipped.
SKIPS: dict[str, str | None] = {
    "make demo": None,
    "make test": "the whole suite, of which this test is a part",
    ". .venv/bin/activate": None,
    "kubeddp train --nproc 2 --script examples/ddp_train.py --epochs 3": None,
    "docker run --rm --gpus all --shm-size=16g my-train": DOCKER + " and a GPU",
    "kubeddp submit pytorchjob --name my-train --image REG/my-train --nnodes 2 --gpus-per-node 8 "
    "--script /app/train.py -- --epochs 3": CLUSTER,
    "kubeddp submit trainjob --name my-train --image REG/my-train --nnodes 2 --gpus-per-node 8 "
    "--script /app/train.py -- --epochs 3": CLUSTER,
    "kubeddp submit indexedjob --name my-train --image REG/my-train --nnodes 2 --gpus-per-node 8 "
    "--script /app/train.py -- --epochs 3": CLUSTER,
    "kubeddp train --nnodes 2 --node-rank 0 --master-addr host-a --script train.py": "needs a "
    "second host and the reader's train.py (tests/integration/test_bare_metal_nodes.py runs two "
    "nodes in network namespaces)",
    "make setup": None,
    "make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu": None,
    'pip install "kubeddp @ git+<this repository>"': PIP,
    'pip install "kubeddp[cli] @ git+<this repository>"': PIP,
    'pip install "kubeddp[cli,kube] @ git+<this repository>"': PIP,
    "kubeddp --version": None,
    "docker pull ghcr.io/kubeddp/kubeddp:0.1.0": REGISTRY,
    "docker pull ghcr.io/kubeddp/kubeddp:0.1.0-efa": REGISTRY,
    "docker pull ghcr.io/kubeddp/kubeddp:0.1.0-cpu": REGISTRY,
    "cosign verify ghcr.io/kubeddp/kubeddp:0.1.0 --certificate-oidc-issuer "
    "https://token.actions.githubusercontent.com --certificate-identity-regexp "
    "'https://github.com/kubeddp/kubeddp/.github/workflows/release.yml@.*'": REGISTRY,
    "helm install demo oci://ghcr.io/kubeddp/charts/kubeddp --version 0.1.0": REGISTRY,
    "kubeddp train --nproc 2 --set workload.name=regression": None,
    "docker run --rm --gpus all --shm-size=16g IMAGE": DOCKER + " and a GPU",
    "kubectl apply -f k8s/pytorchjob-gpu.yaml": CLUSTER,
    "helm install demo charts/kubeddp --set nodes=4 --set gpusPerNode=8 "
    "--set checkpoints.size=200Gi": CLUSTER,
    "kubeddp render pytorchjob --name llm --nnodes 4 --gpus-per-node 8 > llm.yaml": None,
    "kubeddp submit pytorchjob --name llm --nnodes 4 --gpus-per-node 8": CLUSTER,
}
# What a command that ran must have left (a regex of its output, or a file in the copy).
SHOWS = {
    "make demo": r"done: 440 steps in .* final loss",
    "kubeddp train --nproc 2 --script examples/ddp_train.py --epochs 3": r"done: \d+ steps",
    "kubeddp --version": r"kubeddp \d+\.\d+\.\d+",
    "kubeddp train --nproc 2 --set workload.name=regression": r"\[kubeddp\] finished",
}
LEAVES = {
    "kubeddp render pytorchjob --name llm --nnodes 4 --gpus-per-node 8 > llm.yaml": "llm.yaml"
}


def readme_commands() -> list[str]:
    """The README's shell commands in order: each line of a ```sh block, comments dropped."""
    commands, in_sh, pending = [], False, ""
    for line, in_code in lines_and_fences(README):
        if line.lstrip().startswith("```"):
            in_sh = in_code and line.strip() == "```sh" and not in_sh
            continue
        if not in_sh:
            continue
        text = re.sub(r"\s+#\s.*$", "", line).strip()
        if text.endswith("\\"):
            pending += text[:-1].strip() + " "
            continue
        if pending + text:
            commands.append(pending + text)
        pending = ""
    return commands


def test_every_readme_command_is_known_here() -> None:
    assert readme_commands() == list(SKIPS)


def _venv() -> Path:
    return Path(sys.prefix)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The repository's tracked files, with their times, and the venv this test runs in."""
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.skip("needs git (to list the tracked files) and make")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=procs.REPO, capture_output=True,
                            timeout=60, check=True)  # fmt: skip
    root = tmp_path_factory.mktemp("readme") / "kubeddp"
    for name in listed.stdout.decode().split("\0"):
        source = procs.REPO / name
        if name and source.is_file() and not source.is_symlink():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    (root / ".venv").symlink_to(_venv())
    ready = subprocess.run(["make", "-q", "setup"], cwd=root, capture_output=True, timeout=60)
    if ready.returncode != 0:  # make demo would install torch into the venv this test runs in
        pytest.skip(f"{_venv()} is not marked set up for this pyproject.toml (.installed); "
                    "run `make setup` first")  # fmt: skip
    yield root


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "KUBEDDP_"))}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(_venv())))  # fmt: skip
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _shell_line(command: str) -> str:
    """The command after what the README sourced before it (`. .venv/bin/activate` stays in
    the reader's shell for what follows)."""
    before = list(SKIPS)[: list(SKIPS).index(command) + 1]
    sourced = [c for c in before if c.startswith(". ") and not SKIPS[c]]
    return " && ".join([*sourced, "true" if command.startswith(". ") else command])


@pytest.mark.parametrize("command", list(SKIPS))
def test_readme_command(command: str, clone: Path, tmp_path: Path) -> None:
    if SKIPS[command]:
        pytest.skip(SKIPS[command])
    script = _shell_line(command)
    log = tmp_path / "command.log"
    done = procs.run(["bash", "-c", script], log, COMMAND_SECONDS, _environment(), cwd=clone)
    assert done.code == 0, f"{command}\n{done.output[-4000:]}"
    if command in SHOWS:
        assert re.search(SHOWS[command], done.output), f"{command}\n{done.output[-4000:]}"
    if command in LEAVES:
        assert "kind: PyTorchJob" in (clone / LEAVES[command]).read_text()
