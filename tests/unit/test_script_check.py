"""`kubeddp check`, measured on the tutorial-style scripts of tests/tutorial_scripts: the table
below is what each script holds, found by reading it as a reviewer would (a pitfall breaks the
run under kubeddp: it fails, hangs, or loses or corrupts what it saved; advice is what runs but
not as meant). The checker must find exactly that, line by line, on one node, on two nodes and
with `${local_rank}` passed: every finding true, no pitfall missed. Files check cannot take end
in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.script_check.checks import (
    PITFALL,
    RULE_TABLE,
    RULES,
    ScriptCheckError,
    check_file,
    check_source,
)
from kubeddp.trainer.script_check.source import MAX_SCRIPT_BYTES
from kubeddp.trainer.script_check.spawn import spawns_workers, spawns_workers_in
from tests.helpers import cli, procs

SCRIPTS = procs.REPO / "tests" / "tutorial_scripts"
MACRO_ARGS = ["--local_rank=${local_rank}"]
# (nodes, program arguments): the situations a script is checked in.
SITUATIONS = {"one node": (1, []), "two nodes": (2, []), "macro passed": (1, MACRO_ARGS)}
ALWAYS, TWO_NODES, NO_ARGS = "always", "nodes=2", "no-args"

# script -> (rule, when, a piece of the line it is on)
EXPECTED: dict[str, list[tuple[str, str, str]]] = {
    "accumulate_amp.py": [],
    "launch_era.py": [("local-rank-arg", NO_ARGS, 'add_argument("--local_rank"')],
    "mp_process_collectives.py": [
        ("hardcoded-master", TWO_NODES, '["MASTER_ADDR"] = "127.0.0.1"'),
        ("spawn-several-nodes", TWO_NODES, "p = mp.Process("),
    ],
    "nccl_file_init.py": [
        ("file-init", ALWAYS, "dist.init_process_group("),
        ("nccl-cpu-tensor", ALWAYS, "dist.all_reduce(value)"),
    ],
    "no_sampler.py": [
        ("no-distributed-sampler", ALWAYS, "DataLoader(dataset, batch_size=32, shuffle=True)"),
        ("save-every-rank", ALWAYS, 'torch.save(state, f"e{epoch}.pt")'),
    ],
    "no_set_epoch.py": [
        ("load-no-map-location", ALWAYS, "model.load_state_dict(torch.load(CKPT))"),
        ("no-set-epoch", ALWAYS, "sampler = DistributedSampler(dataset)"),
        ("snapshot-in-place", ALWAYS, "torch.save(model.module.state_dict(), CKPT)"),
    ],
    "snapshot_outside.py": [
        ("fixed-master-port", ALWAYS, 'os.environ["MASTER_PORT"] = "29500"'),
        ("snapshot-outside-volume", ALWAYS, 'torch.save(snapshot, "/tmp/snapshot.pt")'),
    ],
    "spawn_multigpu.py": [
        ("hardcoded-master", TWO_NODES, 'os.environ["MASTER_ADDR"] = "localhost"'),
        ("spawn-several-nodes", TWO_NODES, "mp.spawn("),
    ],
    "tcp_init.py": [
        ("init-no-timeout", ALWAYS, "dist.init_process_group("),
        ("tcp-init", TWO_NODES, "dist.init_process_group("),
    ],
    "torchrun_snapshot.py": [("snapshot-in-place", ALWAYS, "torch.save(snapshot, self.snapshot")],
}


def expected(script: str, nodes: int, args: list[str]) -> set[tuple[int, str]]:
    lines = (SCRIPTS / script).read_text().splitlines()
    found = set()
    for rule, when, piece in EXPECTED[script]:
        if (when == TWO_NODES and nodes < 2) or (when == NO_ARGS and args):
            continue
        numbers = [n for n, line in enumerate(lines, start=1) if piece in line]
        assert len(numbers) == 1, f"{script}: {piece!r} is on lines {numbers}"
        found.add((numbers[0], rule))
    return found


def test_the_table_covers_every_script_and_every_rule() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in SCRIPTS.glob("*.py"))
    shown = {rule for findings in EXPECTED.values() for rule, _, _ in findings}
    assert shown == set(RULES), f"no tutorial script shows {set(RULES) - shown}"


@pytest.mark.parametrize("situation", SITUATIONS)
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_finds_exactly_what_the_table_says(script: str, situation: str) -> None:
    nodes, args = SITUATIONS[situation]
    found = {(f.line, f.rule) for f in check_file(str(SCRIPTS / script), nodes, args)}
    assert found == expected(script, nodes, args)


def test_severity_decides_the_exit_code_and_most_tutorial_scripts_pass() -> None:
    """Advice alone exits 0: before, init-no-timeout made check exit 1 on 9 of 11 scripts."""
    failing = [
        script for script in EXPECTED
        if any(RULE_TABLE[rule].severity == PITFALL and when == ALWAYS
               for rule, when, _ in EXPECTED[script])
    ]  # fmt: skip
    assert sorted(failing) == [
        "nccl_file_init.py", "no_sampler.py", "no_set_epoch.py", "snapshot_outside.py",
        "torchrun_snapshot.py",
    ]  # fmt: skip
    assert RULE_TABLE["init-no-timeout"].severity != PITFALL


@pytest.mark.parametrize(
    "script",
    [*sorted((procs.REPO / "examples").glob("*.py")),
     procs.REPO / "tests" / "integration" / "tutorial_torchrun_train.py"],
    ids=lambda p: p.name,
)  # fmt: skip
def test_examples_have_no_pitfall(script: Path) -> None:
    # launch_era_train.py is run with --local_rank=${local_rank}, as its docstring says.
    findings = check_file(str(script), 1, MACRO_ARGS)
    assert [f for f in findings if f.severity == PITFALL] == []


# A script that spawns its workers under each spelling the tutorials' readers write.
SPAWN_FORMS = {
    "alias import": "from torch.multiprocessing import spawn as s\ns(main, nprocs=2)",
    "getattr": "import torch.multiprocessing as mp\ngetattr(mp, 'spawn')(main, nprocs=2)",
    "context inline": "import multiprocessing as mp\nmp.get_context('spawn').Process(target=main)",
    "context variable": "import torch.multiprocessing as mp\nctx = mp.get_context('spawn')\n"
    "ctx.Process(target=main, args=(0, 2)).start()",
    "Process alias": "from multiprocessing import Process as P\nP(target=main, args=(0, 2))",
    "assigned": "import torch.multiprocessing as mp\nlaunch = mp.spawn\nlaunch(main, nprocs=2)",
    "subclass": "import multiprocessing\nclass W(multiprocessing.Process):\n"
    "    def run(self):\n        main(0, 2)\nW().start()",
    "partial": "import functools\nimport torch.multiprocessing as mp\n"
    "mp.spawn(functools.partial(main, world=2), nprocs=2)",
    "start_processes": "import torch.multiprocessing\n"
    "torch.multiprocessing.start_processes(main, nprocs=2, start_method='spawn')",
}
MAIN = (
    "from torch.distributed import init_process_group as ipg\n"
    "def main(rank, world=2):\n    ipg('gloo', rank=rank, world_size=world)\n"
)


@pytest.mark.parametrize("form", SPAWN_FORMS)
def test_spawn_detection_is_not_fooled_by_aliases(form: str) -> None:
    assert spawns_workers_in(MAIN + SPAWN_FORMS[form])


def test_a_process_for_something_else_is_not_spawning_workers() -> None:
    """A torchrun-style script whose helper process never joins a process group runs N times."""
    source = (
        "import multiprocessing as mp\nimport torch.distributed as dist\n"
        "def prepare():\n    print('unpack the data')\n"
        "p = mp.Process(target=prepare)\np.start()\np.join()\ndist.init_process_group('gloo')\n"
    )
    assert not spawns_workers_in(source)
    assert spawns_workers(str(SCRIPTS / "spawn_multigpu.py"))
    assert spawns_workers(str(SCRIPTS / "mp_process_collectives.py"))
    assert not spawns_workers(str(SCRIPTS / "torchrun_snapshot.py"))


LOCAL_RANK = {
    # A mention of LOCAL_RANK that never reaches the flag's value is no fallback: each of these
    # scripts runs on device None (or stops) on every rank under torchrun.
    "read in a print only": ("import os\nprint(os.environ.get('LOCAL_RANK'))\n", True),
    "read in the same print as the flag": (
        "print(args.local_rank, os.environ['LOCAL_RANK'])\n", True),
    "exported from the flag": ("os.environ['LOCAL_RANK'] = str(args.local_rank)\n", True),
    "a condition on it": ("if 'LOCAL_RANK' in os.environ:\n    print('under torchrun')\n",
                          True),
    "a string naming it": ("print('set from LOCAL_RANK')\n", True),
    "another variable from it": ("world = int(os.environ['LOCAL_RANK']) + 1\n", True),
    # A fallback to the environment: the flag is optional.
    "default from the env": ("", False),
    "falls back in the same line": (
        "local = args.local_rank if args.local_rank is not None else "
        "int(__import__('os').environ['LOCAL_RANK'])\n", False),
    "falls back with or": ("local = args.local_rank or int(os.getenv('LOCAL_RANK', 0))\n",
                           False),
    "the env first, the flag its default": (
        "local = int(os.environ.get('LOCAL_RANK', args.local_rank))\n", False),
    "assigned from the env": ("import os\nargs.local_rank = int(os.environ['LOCAL_RANK'])\n",
                              False),
    "the variable it goes to, from the env": (
        "local = args.local_rank\nif local is None:\n    local = int(os.environ['LOCAL_RANK'])\n",
        False),
}  # fmt: skip


@pytest.mark.parametrize("flag", ["--local_rank", "--local-rank"])
@pytest.mark.parametrize("case", LOCAL_RANK)
def test_local_rank_arg_looks_at_how_the_flag_is_used(case: str, flag: str) -> None:
    extra, fires = LOCAL_RANK[case]
    default = ", default=int(os.environ['LOCAL_RANK'])" if case == "default from the env" else ""
    source = (
        "import argparse, os\nimport torch.distributed as dist\np = argparse.ArgumentParser()\n"
        f"p.add_argument('{flag}', type=int{default})\nargs = p.parse_args()\n{extra}"
        "dist.init_process_group('gloo')\nprint(args.local_rank)\n"
    )
    rules = [f.rule for f in check_source(source)]
    assert ("local-rank-arg" in rules) == fires, rules
    assert "local-rank-arg" not in [f.rule for f in check_source(source, 1, MACRO_ARGS)]


SAVE_LOAD = "import os, torch\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
SNAPSHOTS = {
    # resumed from what it overwrites: a kill during the save leaves every retry a half file
    "the same file": ("if os.path.exists('snap.pt'):\n    torch.load('snap.pt')\n"
                      "if dist.get_rank() == 0:\n    torch.save({}, 'snap.pt')\n", True),
    "the same variable": ("PATH = 'model.pt'\nstate = torch.load(PATH)\n"
                          "if dist.get_rank() == 0:\n    torch.save(state, PATH)\n", True),
    "named alike, one text unknown": (
        "def load(snapshot_path):\n    return torch.load(snapshot_path)\n"
        "PATH = 'snapshot.pt'\nif dist.get_rank() == 0:\n    torch.save({}, PATH)\n", True),
    # nobody resumes from the file saved
    "saved once, never loaded": ("if dist.get_rank() == 0:\n    torch.save({}, 'final.pt')\n",
                                 False),
    "saved once, another file loaded": (
        "torch.load('pretrained_ckpt.pt')\nif dist.get_rank() == 0:\n"
        "    torch.save({}, 'snapshot.pt')\n", False),
    "a new name each epoch": (
        "ckpt_path = None\nif ckpt_path is not None:\n    torch.load(ckpt_path)\n"
        "for epoch in range(3):\n    if dist.get_rank() == 0:\n"
        "        torch.save({}, '%d.ckpt' % epoch)\n", False),
    "an f-string name each epoch": (
        "torch.load(os.environ['RESUME_CKPT'])\nfor e in range(3):\n"
        "    if dist.get_rank() == 0:\n        torch.save({}, f'ckpt-{e}.pt')\n", False),
    "written aside, then renamed": (
        "torch.load('snap.pt')\nif dist.get_rank() == 0:\n    torch.save({}, 'snap.tmp')\n"
        "    os.replace('snap.tmp', 'snap.pt')\n", False),
}  # fmt: skip


@pytest.mark.parametrize("case", SNAPSHOTS)
def test_snapshot_in_place_needs_the_file_it_resumes_from(case: str) -> None:
    body, fires = SNAPSHOTS[case]
    rules = [f.rule for f in check_source(SAVE_LOAD + body)]
    assert ("snapshot-in-place" in rules) == fires, rules


def run_check(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kubeddp", "check", *args],
        capture_output=True, text=True, timeout=timeout, cwd=procs.REPO,
    )  # fmt: skip


@pytest.fixture
def kubeddp(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`kubeddp ARGS` in this process (tests/helpers/cli.py): what a command prints and refuses
    needs no process of its own. A file that could hang a read is checked by a process of its
    own (run_check above), which its timeout can end."""
    return lambda *args: cli.run(list(args), monkeypatch, capsys)


def test_cli_output_severity_line_and_exit_codes(kubeddp) -> None:
    def run_check(*args: str) -> subprocess.CompletedProcess:
        return kubeddp("check", *args)

    advice = run_check(str(SCRIPTS / "tcp_init.py"))
    assert advice.returncode == exit_codes.OK, advice.stderr
    assert re.fullmatch(
        r".*tcp_init\.py:16: advice init-no-timeout: .+; fix: .*timeout.*\n", advice.stdout
    ), advice.stdout
    several = run_check("--nnodes", "2", str(SCRIPTS / "tcp_init.py"))
    assert several.returncode == exit_codes.TRAINING_FAILED
    assert ": pitfall tcp-init: " in several.stdout and "127.0.0.1" in several.stdout
    for same in (["--nodes", "2"], ["--nnodes", "1:2"]):  # the old name; torchrun's MIN:MAX
        assert run_check(*same, str(SCRIPTS / "tcp_init.py")).stdout == several.stdout
    clean = run_check(str(SCRIPTS / "spawn_multigpu.py"))
    assert (clean.returncode, clean.stdout) == (0, ""), clean.stderr
    passed = run_check(str(SCRIPTS / "launch_era.py"), "--", "--local_rank=${local_rank}")
    assert (passed.returncode, passed.stdout) == (0, ""), passed.stdout


def fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


def huge(path: Path) -> str:
    with open(path, "wb") as handle:
        handle.truncate(MAX_SCRIPT_BYTES + 1)  # sparse: no disk used
    return str(path)


def written(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


DEEP = 120  # parentheses: Python's parser stops at 200
REFUSED = {
    # what -> (make the file, a word of the one line)
    "a FIFO (it hung)": (lambda p: fifo(p / "pipe.py"), "a FIFO"),
    "/dev/zero (read without bound)": (lambda p: "/dev/zero", "a character device"),
    "a directory": (lambda p: str(p), "directory"),
    "missing": (lambda p: str(p / "missing.py"), "No such file"),
    "huge": (lambda p: huge(p / "big.py"), "more than the 8 MiB"),
    "not UTF-8": (lambda p: written(p / "latin.py", b"x = '\xe9'\n"), "utf-8"),
    "not Python": (lambda p: written(p / "broken.py", b"def f(:\n"), "not valid Python"),
    "NUL bytes": (lambda p: written(p / "nul.py", b"x = 1\0\n"), "null bytes"),
    "nested beyond Python's parser": (
        lambda p: written(p / "deep.py", ("x = " + "-" * 100_000 + "1\n").encode()),
        "nested too deeply",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_files_check_cannot_take_end_in_one_line(case: str, tmp_path: Path) -> None:
    make, says = REFUSED[case]
    done = run_check(make(tmp_path), timeout=30)
    assert done.returncode == exit_codes.BAD_INPUT, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert lines[0].startswith("kubeddp check: error: ")


TAKEN = {
    "a UTF-8 BOM": b"\xef\xbb\xbfimport torch\ntorch.save(1, '/tmp/snapshot.pt')\n",
    "a PEP 263 coding line": b"# -*- coding: latin-1 -*-\nimport torch\nname = '\xe9'\n"
    b"torch.save(1, '/tmp/snapshot.pt')\n",
    "deep but valid": b"import torch\nif " + b"not " * 800 + b"x:\n"
    b"    torch.save(1, '/tmp/snapshot.pt')\n",
}


@pytest.mark.parametrize("case", TAKEN)
def test_what_python_runs_check_reads(case: str, tmp_path: Path) -> None:
    path = written(tmp_path / "t.py", TAKEN[case])
    rules = [(f.line, f.rule) for f in check_file(path)]
    assert rules[-1][1] == "snapshot-outside-volume", rules


def test_a_fifo_with_a_writer_waiting_is_refused_too(tmp_path: Path) -> None:
    path = fifo(tmp_path / "pipe.py")
    writer = threading.Thread(target=lambda: Path(path).write_text("x = 1\n"), daemon=True)
    writer.start()
    with pytest.raises(ScriptCheckError, match="a FIFO"):
        check_file(path)
    # Let the writer finish: a reader that does not wait for a writer (the check's own open may
    # have been the writer's partner already, and then a waiting open would wait for ever).
    unblock = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        writer.join(timeout=30)
    finally:
        os.close(unblock)
    assert not writer.is_alive()


def test_train_warns_the_pitfalls_check_finds(kubeddp) -> None:
    train = kubeddp("train", "--dry-run", "--script", str(SCRIPTS / "snapshot_outside.py"))
    assert train.returncode == 0, train.stderr
    warned = [line for line in train.stderr.splitlines() if "warning:" in line]
    assert [re.search(r"\.py:(\d+): pitfall ([a-z-]+):", w).groups() for w in warned] == [
        ("30", "snapshot-outside-volume"),
    ], train.stderr  # the fixed port is advice: check shows it, train does not


def test_dry_run_plans_a_spawning_script_once_and_previews_an_image_path(kubeddp) -> None:
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


RENDER = ["render", "pytorchjob", "--name", "sp", "--image", "kubeddp:cpu",
          "--validate-against", "offline"]  # fmt: skip


def test_render_refuses_a_spawning_program_on_several_nodes_as_launch_does(kubeddp) -> None:
    """One decision: render (and submit, through the same code) refuse with launch's line,
    where the manifest was printed with a warning and every pod then exited 2."""
    one = kubeddp(*RENDER, "--nodes", "1", "--spawns-workers", "--script", "/app/s.py", "--", "4")
    assert one.returncode == 0, one.stderr
    assert "- --spawns-workers\n" in one.stdout
    local = str(SCRIPTS / "spawn_multigpu.py")
    launch = kubeddp("train", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                     "--dry-run", "--script", local)  # fmt: skip
    assert launch.returncode == exit_codes.BAD_INPUT
    said = {}
    cases = {
        "detected": ["--nodes", "2", "--script", local],
        "elastic": ["--elastic", "1:3", "--script", local],
        "flag": ["--nodes", "2", "--spawns-workers", "--script", "/app/s.py"],
    }
    for case, args in cases.items():
        render = kubeddp(*RENDER, *args)
        assert (render.returncode, render.stdout) == (exit_codes.BAD_INPUT, ""), render.stderr
        line = render.stderr.strip()
        assert line.startswith("kubeddp render: error: ") and "\n" not in line, line
        said[case] = line.split("error: ", 1)[1]
    assert said["detected"] == launch.stderr.strip().split("error: ", 1)[1]  # the same line
    submit = kubeddp("submit", "pytorchjob", "--name", "sp", "--image", "kubeddp:cpu",
                     "--nodes", "2", "--script", local)  # fmt: skip
    assert submit.returncode == exit_codes.BAD_INPUT  # refused before any cluster is asked
    assert submit.stderr.strip() == f"kubeddp submit: error: {said['detected']}"
    assert "the 1:3 nodes" in said["elastic"] and said["flag"].startswith("/app/s.py starts")
    detected = kubeddp(*RENDER, "--nodes", "2", "--script", "/app/not-here.py")
    assert detected.returncode == 0 and "spawns-workers" not in detected.stdout


def test_docs_table_lists_every_rule_with_its_severity() -> None:
    doc = (procs.REPO / "docs" / "your-own-script.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)` \| (pitfall|advice) \|", doc, re.MULTILINE)
    assert sorted(rows) == sorted((rule, spec.severity) for rule, spec in RULE_TABLE.items())
