"""`kubeddp check`: the ten tutorial-style scripts of tests/tutorial_scripts hold their
pitfalls on marked lines; the checker finds exactly those (rule and line), under one node, two
nodes and with `${local_rank}` passed, and nothing in examples/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.launcher.script_check import RULES, check_file, spawns_workers
from tests.helpers import procs

SCRIPTS = procs.REPO / "tests" / "tutorial_scripts"
MARKER = re.compile(r"# pitfall(?:\((?P<when>[^)]*)\))?: (?P<rules>[a-z-]+(?:, [a-z-]+)*)")
MACRO_ARGS = ["--local_rank=${local_rank}"]
# (nodes, program arguments): the situations a script is checked in.
SITUATIONS = {"one node": (1, []), "two nodes": (2, []), "macro passed": (1, MACRO_ARGS)}


def planted(path: Path, nodes: int, args: list[str]) -> set[tuple[int, str]]:
    found = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        for match in MARKER.finditer(line):
            when = match.group("when")
            if when == "nodes=2" and nodes < 2 or when == "no-args" and args:
                continue
            found |= {(number, rule) for rule in match.group("rules").split(", ")}
    return found


def tutorial_scripts() -> list[Path]:
    return sorted(SCRIPTS.glob("*.py"))


def test_ten_scripts_cover_every_rule_with_and_without_it() -> None:
    scripts = tutorial_scripts()
    assert len(scripts) == 10
    for rule in RULES:
        showing = [s for s in scripts if any(r == rule for _, r in planted(s, 2, []))]
        assert showing, f"no tutorial script shows {rule}"
        assert len(showing) < len(scripts), f"every tutorial script shows {rule}"


@pytest.mark.parametrize("situation", SITUATIONS)
@pytest.mark.parametrize("script", tutorial_scripts(), ids=lambda p: p.stem)
def test_finds_each_planted_pitfall_and_nothing_else(script: Path, situation: str) -> None:
    nodes, args = SITUATIONS[situation]
    found = {(f.line, f.rule) for f in check_file(str(script), nodes, args)}
    assert found == planted(script, nodes, args)


@pytest.mark.parametrize("script", sorted((procs.REPO / "examples").glob("*.py")), ids=str)
def test_examples_are_clean(script: Path) -> None:
    # launch_era_train.py is run with --local_rank=${local_rank}, as its docstring says.
    assert check_file(str(script), 1, MACRO_ARGS) == []


def test_spawn_detection() -> None:
    assert spawns_workers(str(SCRIPTS / "spawn_multigpu.py"))
    assert spawns_workers(str(SCRIPTS / "mp_process_collectives.py"))
    assert not spawns_workers(str(SCRIPTS / "torchrun_snapshot.py"))
    assert not spawns_workers(str(procs.REPO / "examples" / "ddp_train.py"))


def run_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kubeddp", "check", *args],
        capture_output=True, text=True, timeout=60, cwd=procs.REPO,
    )  # fmt: skip


def test_cli_output_names_line_pitfall_and_fix_and_exit_codes() -> None:
    done = run_check(str(SCRIPTS / "no_set_epoch.py"))
    assert done.returncode == exit_codes.TRAINING_FAILED, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    assert re.fullmatch(r".*no_set_epoch\.py:23: load-no-map-location: .+; fix: .+", lines[0])
    assert re.fullmatch(r".*no_set_epoch\.py:27: no-set-epoch: .+; fix: .*set_epoch.*", lines[1])
    clean = run_check(str(SCRIPTS / "spawn_multigpu.py"))
    assert (clean.returncode, clean.stdout) == (0, ""), clean.stderr
    several = run_check("--nodes", "2", str(SCRIPTS / "spawn_multigpu.py"))
    assert several.returncode == 1 and "spawn-several-nodes" in several.stdout
    passed = run_check(str(SCRIPTS / "launch_era.py"), "--", "--local_rank=${local_rank}")
    assert passed.returncode == 0, passed.stdout


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    for target in (str(broken), str(tmp_path / "missing.py")):
        done = run_check(target)
        assert done.returncode == exit_codes.BAD_INPUT
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def kubeddp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kubeddp", *args],
        capture_output=True, text=True, timeout=120, cwd=procs.REPO,
    )  # fmt: skip


def test_train_and_render_warn_what_check_finds() -> None:
    train = kubeddp("train", "--dry-run", "--script", str(SCRIPTS / "no_set_epoch.py"))
    assert train.returncode == 0, train.stderr
    warned = [line for line in train.stderr.splitlines() if "warning:" in line]
    assert [re.search(r"\.py:(\d+): ([a-z-]+):", w).groups() for w in warned] == [
        ("23", "load-no-map-location"), ("27", "no-set-epoch"),
    ]  # fmt: skip
    render = kubeddp(
        "render", "pytorchjob", "--name", "sp", "--nodes", "2", "--image", "kubeddp:cpu",
        "--validate-against", "offline", "--script", str(SCRIPTS / "spawn_multigpu.py"),
    )  # fmt: skip
    assert render.returncode == 0, render.stderr
    assert "kubeddp render: warning: " in render.stderr
    assert "spawn_multigpu.py:127: spawn-several-nodes" in render.stderr


def test_dry_run_plans_a_spawning_script_once_and_previews_an_image_path() -> None:
    spawn = kubeddp(
        "train", "--dry-run", "--nproc", "2", "--script", str(SCRIPTS / "spawn_multigpu.py")
    )
    assert spawn.returncode == 0, spawn.stderr
    assert '"nproc_per_node": 1' in spawn.stdout
    assert "--nproc-per-node 2 ignored: the program starts its own workers" in spawn.stderr
    image = kubeddp("launch", "--dry-run", "--script", "/app/not-here/train.py", "--", "--x")
    assert image.returncode == 0, image.stderr
    assert '"world_size": 1' in image.stdout
    notes = image.stderr.strip().splitlines()
    assert len(notes) == 1 and "not on this machine" in notes[0], image.stderr


def test_render_passes_spawns_workers_and_refuses_it_on_several_nodes() -> None:
    render = ["render", "pytorchjob", "--name", "sp", "--image", "kubeddp:cpu",
              "--validate-against", "offline", "--script", "/app/spawn.py"]  # fmt: skip
    one = kubeddp(*render, "--nodes", "1", "--spawns-workers", "--", "4", "2")
    assert one.returncode == 0, one.stderr
    assert "- --spawns-workers\n" in one.stdout
    several = kubeddp(*render, "--nodes", "2", "--spawns-workers")
    assert several.returncode == exit_codes.BAD_INPUT
    assert "each of the 2 nodes would train its own copy" in several.stderr
    detected = kubeddp(*render, "--nodes", "2")
    assert detected.returncode == 0 and "spawns-workers" not in detected.stdout


def test_docs_table_lists_every_rule() -> None:
    doc = (procs.REPO / "docs" / "your-own-script.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)` \|", doc, re.MULTILINE)
    assert sorted(rows) == sorted(RULES)
