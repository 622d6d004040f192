"""A user's program never lends its files to the runner: `json.py`, `torch.py` or a `kubeddp/`
package in checkpoint.dir (where launch starts the program, and where the keeper fetches what is
on the claim) or beside the script are never imported by the runner or the workers; the program
still sees what `python` gives it (its own directory first on sys.path, `python -m` finding
modules where launch started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import procs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HIJACK = "import pathlib, sys; pathlib.Path({marker!r}).touch(); sys.exit('hijacked: {name}')\n"


def _plant(folder: Path, markers: Path, *names: str) -> None:
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HIJACK.format(marker=str(markers / path.stem), name=name))


def _run(tmp_path: Path, cwd: Path, *program: str) -> procs.Finished:
    ck, markers = tmp_path / "ck", tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    _plant(ck, markers, "json.py", "torch.py", "yaml.py", "kubeddp/__init__.py")
    (tmp_path / "config.yaml").write_text(f"checkpoint:\n  dir: {ck}\n")
    argv = procs.kubeddp_argv("train", "--nproc", "1", "--config", str(tmp_path / "config.yaml"),
                              *program)  # fmt: skip
    env = procs.child_env({"KUBEDDP_PROGRAM_IN_CHECKPOINT_DIR": "1"})
    return procs.run(argv, tmp_path / "run.log", 420, env, cwd=cwd)


def test_a_script_and_checkpoint_dir_lend_no_module_to_the_runner(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    _plant(app, tmp_path / "markers", "json.py", "tokenize.py")  # beside the script
    (app / "train.py").write_text(
        "import os, sys\n"
        "print('program ran in', os.getcwd(), 'path0', sys.path[0], flush=True)\n"
        "print('safe path', os.environ.get('PYTHONSAFEPATH'), flush=True)\n"
    )
    done = _run(tmp_path, tmp_path, "--script", str(app / "train.py"))
    assert done.code == 0, done.output
    assert f"program ran in {tmp_path / 'ck'} path0 {app}" in done.output, done.output
    assert "safe path None" in done.output  # the program's own children start as usual
    assert not list((tmp_path / "markers").iterdir()), done.output


def test_a_module_is_found_where_launch_started_not_in_checkpoint_dir(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "appmod.py").write_text("import os\nprint('module ran in', os.getcwd(), flush=True)\n")
    done = _run(tmp_path, app, "--module", "appmod")
    assert done.code == 0, done.output
    assert f"module ran in {tmp_path / 'ck'}" in done.output, done.output
    assert not list((tmp_path / "markers").iterdir()), done.output
