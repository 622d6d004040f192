"""A user's own program (`--script`/`--module`) as launch plans it and the runner runs it, without
torchrun: the dry-run command line, the one-line errors for bad input, the runner's fidelity to
`python` (argv, __main__, sys.path[0], exit codes, SIGTERM), and kubeddp.api's cheap import.

The runner runs as real processes throughout (what it must match is `python`'s own process);
launch's plans and refusals run in this process, one of them as the command's own process too.
The runs that need several workers are in tests/integration/test_user_script.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.launcher.program_options import torchrun_worker_args
from kubeddp.trainer.process_contract import resolved_config_env
from kubeddp.trainer.worker.program import RUNNER_MODULE, Program
from tests.helpers import cli
from tests.helpers.procs import REPO

pytestmark = pytest.mark.timeout(120)

SHOW = """\
import json, os, sys
print("SHOW " + json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
      "file": __file__}), flush=True)
"""


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Nothing of this machine's launcher env leaks in (a CI runner may set RANK...)."""
    base = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    base["PYTHONPATH"] = str(REPO)
    return {**base, **(extra or {})}


def kubeddp_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`kubeddp ARGS` as its own process: what the console command does."""
    return subprocess.run(
        [sys.executable, "-m", "kubeddp", *args],
        env=clean_env({"KUBEDDP_DRY_RUN_GPUS": "0"}),
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def kubeddp(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`kubeddp ARGS` in this process, in the clean environment and working directory a
    process would get: planning and refusing need no process of their own (kubeddp_process
    above proves the command runs as one)."""

    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
        env = {"KUBEDDP_DRY_RUN_GPUS": "0", **(env or {})}
        return cli.run(list(args), monkeypatch, capsys, env, cwd)

    return run


def runner(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", RUNNER_MODULE, *args],
        env=clean_env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def shown(output: str) -> dict:
    (line,) = [line for line in output.splitlines() if line.startswith("SHOW ")]
    return json.loads(line[len("SHOW ") :])


@pytest.fixture
def programs(tmp_path: Path) -> Path:
    (tmp_path / "show.py").write_text(SHOW)
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(SHOW)
    (package / "train.py").write_text(SHOW)
    return tmp_path


# --- the plan: what torchrun is given ------------------------------------------------------


def test_dry_run_shows_the_program_and_its_arguments_as_written(programs: Path) -> None:
    args = ["--lr=${local_rank}", "two words", "--flag", "--", "cost$5", "$$"]
    done = kubeddp_process("train", "--nproc", "2", "--dry-run", "--script", "show.py", "--", *args,
                   cwd=programs)  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["argv"]
    assert argv[0] == "torchrun" and "--nproc-per-node=2" in argv
    tail = argv[argv.index("--module") :]
    # torchrun's Template substitution turns $$ into $: the other dollars are escaped for it.
    escaped = ["--lr=${local_rank}", "two words", "--flag", "--", "cost$$5", "$$$$"]
    assert tail == ["--module", RUNNER_MODULE, "script", "show.py", *escaped]


def test_torchrun_gives_the_program_its_arguments_exactly() -> None:
    """torchrun's own macro substitution on the escaped arguments yields the originals."""
    from torch.distributed.elastic.utils.api import macros

    written = ["--lr=${local_rank}", "a$b", "$$", "${other}", "$local_rank", "x" * 3]
    program = Program("script", "t.py", tuple(written))
    received = macros.substitute(torchrun_worker_args(program), "3")
    assert received == ["script", "t.py", "--lr=3", "a$b", "$$", "${other}", "$local_rank", "xxx"]


def test_module_form_and_launch_options_stay_launchs(kubeddp, programs: Path) -> None:
    done = kubeddp(
        "launch", "--dry-run", "--set", "metrics.port=0", "--set",
        "checkpoint.preempt_grace_seconds=5", "--module", "mypkg.train", "--config", "mine.yaml",
        "--set", "x=1", cwd=programs,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["argv"]
    # --config and --set after the module are the program's own options, not launch's
    assert argv[-7:] == [
        RUNNER_MODULE, "module", "mypkg.train", "--config", "mine.yaml", "--set", "x=1"
    ]  # fmt: skip


def test_a_module_in_directories_without_init_is_found(kubeddp, programs: Path) -> None:
    """`-m tests.integration.train` where neither directory has __init__.py (namespace
    packages, as in many repos): found without importing its parents."""
    nested = programs / "ns" / "inner"
    nested.mkdir(parents=True)
    (nested / "train.py").write_text(SHOW)
    done = kubeddp("launch", "--dry-run", "--module", "ns.inner.train", cwd=programs)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["argv"][-2:] == ["module", "ns.inner.train"]
    missing = kubeddp("launch", "--dry-run", "--module", "ns.inner.nope", cwd=programs)
    assert missing.returncode == exit_codes.BAD_INPUT
    assert "--module ns.inner.nope: cannot import it" in missing.stderr


def test_built_in_trainer_still_takes_config_after_dash(kubeddp) -> None:
    """The manifests' `-- --config FILE` is launch's; the workers get the loaded config in
    their environment, so their command line ends with the worker module."""
    done = kubeddp("launch", "--dry-run", "--", "--config", "/etc/kubeddp/config.yaml")
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["argv"]
    assert argv[-2:] == ["--module", "kubeddp.trainer.worker"]


BAD_INPUT = {
    "script missing": (["--script", "nope.py"], ["--script nope.py: no such file"]),
    "script is a directory": (["--script", "mypkg"], ["--script mypkg: not a file"]),
    "module not found": (["--module", "no_such_mod"], ["--module no_such_mod: cannot import"]),
    "module in a missing package": (
        ["--module", "no_such_pkg.train"],
        ["--module no_such_pkg.train: cannot import it (ModuleNotFoundError"],
    ),
    "built-in trainer setting": (
        ["--set", "train.lr=0.1", "--script", "show.py"],
        ["--set train.lr=0.1 configures the built-in trainer", "after the program"],
    ),
    "checkpoint setting of the built-in trainer": (
        ["--set", "checkpoint.dir=/x", "--module", "mypkg"],
        ["--set checkpoint.dir=/x configures the built-in trainer, which --module replaces"],
    ),
}


@pytest.mark.parametrize("case", BAD_INPUT)
@pytest.mark.parametrize("command", ["train", "launch"])
def test_bad_program_input_is_one_line_and_exit_2(
    kubeddp, programs: Path, case: str, command: str
) -> None:
    args, mentions = BAD_INPUT[case]
    done = kubeddp(command, *args, "--", "--epochs", "1", cwd=programs)
    assert done.returncode == exit_codes.BAD_INPUT, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"kubeddp {command}: error: ")
    for text in mentions:
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"


# --- bare metal: --nnodes/--node-rank/--master-addr -----------------------------------------


def test_bare_metal_static_flags_win_over_the_env(kubeddp) -> None:
    env = {"MASTER_ADDR": "other", "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1"}
    done = kubeddp("train", "--dry-run", "--nproc", "2", "--nnodes", "2", "--node-rank", "1",
                   "--master-addr", "host-a", "--master-port", "29600", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (plan["source"], plan["nnodes"], plan["node_rank"], plan["world_size"]) == (
        "flags", "2", 1, 4,
    )  # fmt: skip
    assert plan["rdzv_endpoint"] == "host-a:29600" and plan["wait_for_host"]
    assert "--master-addr=host-a" in plan["argv"] and "--node-rank=1" in plan["argv"]


def test_bare_metal_elastic_flags(kubeddp) -> None:
    done = kubeddp("launch", "--dry-run", "--nnodes", "1:3", "--rdzv-endpoint", "host-a:29400",
                   "--rdzv-id", "run7", "--script", "examples/ddp_train.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (plan["source"], plan["nnodes"], plan["rdzv_backend"], plan["rdzv_id"]) == (
        "flags", "1:3", "c10d", "run7",
    )  # fmt: skip
    assert "--rdzv-endpoint=host-a:29400" in plan["argv"]
    assert plan["argv"][-3:] == [RUNNER_MODULE, "script", "examples/ddp_train.py"]


NODE_FLAG_ERRORS = {
    "rank too high": (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank=2"),
    "no rank": (["--nnodes", "2", "--master-addr", "h"], "needs --node-rank"),
    "no host": (["--nnodes", "2", "--node-rank", "0"], "needs the rendezvous host"),
    "no count": (["--master-addr", "h"], "--nnodes is not"),
    "range with master": (["--nnodes", "1:2", "--node-rank", "0", "--master-addr", "h"], "range"),
    "both hosts": (["--nnodes", "2", "--master-addr", "h", "--rdzv-endpoint", "h:1"], "both"),
    "bad endpoint": (["--nnodes", "2", "--rdzv-endpoint", "h"], "must be HOST:PORT"),
    "rank with endpoint": (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1"], "drop"),
    "bad port": (
        ["--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--master-port", "70000"],
        "not a TCP port",
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", NODE_FLAG_ERRORS)
def test_bad_node_flags_are_one_line(kubeddp, case: str) -> None:
    args, mention = NODE_FLAG_ERRORS[case]
    done = kubeddp("train", "--dry-run", *args)
    assert done.returncode == exit_codes.BAD_INPUT, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and mention in lines[0], done.stderr


def test_one_node_without_a_host_is_standalone(kubeddp) -> None:
    done = kubeddp("train", "--dry-run", "--nnodes", "1")
    assert done.returncode == 0 and json.loads(done.stdout)["source"] == "standalone"


# --- the runner: like `python script.py` / `python -m module` ---------------------------------


def test_script_runs_as_python_would(programs: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    done = runner("script", str(programs / "show.py"), "--a", "b c", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    seen = shown(done.stdout)
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(programs / "show.py"), "--a", "b c"]
    assert seen["path0"] == str(programs)  # the script's folder, not the working directory


def test_module_and_package_run_as_python_m_would(programs: Path) -> None:
    for name, file in (("mypkg.train", "mypkg/train.py"), ("mypkg", "mypkg/__main__.py")):
        done = runner("module", name, "--x", cwd=programs)
        assert done.returncode == 0, done.stderr
        seen = shown(done.stdout)
        assert seen["name"] == "__main__"
        assert seen["argv"] == [str(programs / file), "--x"]
        assert seen["path0"] == str(programs)  # -m: the working directory comes first


AT_EXIT = """\
import atexit, threading, time
log = open("log.txt", "w")  # never closed or flushed: the interpreter's finalizer would
log.write("written, not flushed")
def late():
    time.sleep(0.5)
    open("thread.txt", "w").write("the thread finished")
threading.Thread(target=late).start()  # not a daemon: python waits for it
atexit.register(lambda: open("atexit.txt", "w").write("ran"))
"""


def test_a_finished_program_ends_as_python_would(tmp_path: Path) -> None:
    """The runner leaves without torch's C++ teardown (it can abort with 134), yet what a
    program relies on at exit happens: threads joined, atexit run, open files flushed."""
    (tmp_path / "at_exit.py").write_text(AT_EXIT)
    done = runner("script", "at_exit.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log.txt").read_text() == "written, not flushed"
    assert (tmp_path / "thread.txt").read_text() == "the thread finished"
    assert (tmp_path / "atexit.txt").read_text() == "ran"


EXITS = {
    "returns": ("pass", exit_codes.OK, None),
    "sys.exit(3)": ("import sys; sys.exit(3)", 3, None),
    "sys.exit(message)": ("import sys; sys.exit('bad input file')", 1, "bad input file"),
    "own exception": (
        "raise ValueError('no such column')",
        exit_codes.TRAINING_FAILED,
        "ValueError: no such column; exit code 1 (failed, fatal)",
    ),  # fmt: skip
    "a peer is gone": (
        "raise ConnectionResetError('peer closed')",
        exit_codes.PEER_FAILED,
        "exit code 201 (peer failed, retryable)",
    ),  # fmt: skip
    "preempted": ("import sys; sys.exit(143)", exit_codes.PREEMPTED, None),
    "Ctrl-C": ("raise KeyboardInterrupt", exit_codes.INTERRUPTED, "interrupted; exit code 130"),
}


@pytest.mark.parametrize("case", EXITS)
def test_exit_codes(tmp_path: Path, case: str) -> None:
    code, expected, message = EXITS[case]
    (tmp_path / "p.py").write_text(code + "\n")
    done = runner("script", "p.py", cwd=tmp_path)
    assert done.returncode == expected, done.stderr
    if message:
        assert message in done.stderr
    if "exception" in case or "peer" in case:
        assert "Traceback (most recent call last)" in done.stderr  # the program's own traceback
    if case == "Ctrl-C":
        assert "Traceback" not in done.stderr  # quietly


SIGNAL_PROGRAM = """\
import sys, time
POLL = {poll}
if POLL:
    from kubeddp import api
    api.stop_requested()  # polled once before SIGTERM: a program that reacts to the flag
print("ready", flush=True)
while True:
    if POLL and api.stop_requested():
        print("saving", flush=True)
        time.sleep({save_seconds})
        sys.exit(api.EXIT_PREEMPTED)
    time.sleep(0.01)
"""


def signalled(tmp_path: Path, poll: bool, save_seconds: float, grace: float) -> tuple[int, str]:
    """Start the program, SIGTERM it once it runs; its exit code, output and seconds to exit."""
    from kubeddp.trainer.config import load_config

    (tmp_path / "p.py").write_text(SIGNAL_PROGRAM.format(poll=poll, save_seconds=save_seconds))
    cfg = load_config(None, [f"checkpoint.preempt_grace_seconds={grace}"])
    proc = subprocess.Popen(
        [sys.executable, "-m", RUNNER_MODULE, "script", "p.py"],
        env=clean_env(resolved_config_env(cfg)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        code = proc.wait(30)
        return code, proc.stdout.read() + f"\nexited after {time.monotonic() - start:.1f}s"
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_ends_a_program_that_never_polls_at_once(tmp_path: Path) -> None:
    code, output = signalled(tmp_path, poll=False, save_seconds=0, grace=30)
    assert code == exit_codes.PREEMPTED, output
    assert "[kubeddp]" not in output  # quietly: launch says once why its workers stop


def test_sigterm_lets_a_polling_program_save_and_exit(tmp_path: Path) -> None:
    code, output = signalled(tmp_path, poll=True, save_seconds=0.5, grace=30)
    assert code == exit_codes.PREEMPTED, output
    assert "saving" in output and "is now true; the program has 30s" in output
    assert "no checkpoint within" not in output


def test_sigterm_grace_runs_out(tmp_path: Path) -> None:
    code, output = signalled(tmp_path, poll=True, save_seconds=60, grace=1)
    assert code == exit_codes.PREEMPTED, output
    assert (
        "saving" in output and "no checkpoint within checkpoint.preempt_grace_seconds=1" in output
    )


# --- kubeddp.api ---------------------------------------------------------------------------


def test_api_import_is_cheap_and_inert() -> None:
    code = textwrap.dedent(
        """
        import signal, sys
        before = signal.getsignal(signal.SIGTERM)
        import kubeddp.api as api
        heavy = sorted(m for m in ("torch", "prometheus_client", "yaml") if m in sys.modules)
        unchanged = signal.getsignal(signal.SIGTERM) is before
        api.report_step(1, samples=4, loss=0.5)  # no PROMETHEUS_MULTIPROC_DIR: a no-op
        print(heavy, unchanged, api.EXIT_PREEMPTED, api.stop_requested(),
              "prometheus_client" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True", "143", "False", "False"]


def test_the_fingerprint_covers_the_file_that_runs(tmp_path: Path, monkeypatch) -> None:
    """The finished-run record names a program by its file's content too: an edited script (or
    module, or executable) at the same path with the same arguments is another run."""
    from kubeddp.trainer.launcher.program_options import program_fingerprint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    files = {
        "script": tmp_path / "train.py",
        "module": tmp_path / "pkg" / "__main__.py",
        "executable": tmp_path / "run.sh",
    }
    targets = {
        "script": str(files["script"]),
        "module": "pkg",
        "executable": str(files["executable"]),
    }
    for mode, path in files.items():
        path.write_text("print('one')\n")
        program = Program(mode, targets[mode], ("--epochs", "1"))
        first = program_fingerprint(program)
        assert first == program_fingerprint(program), mode  # the same program, the same name
        path.write_text("print('two')\n")
        assert program_fingerprint(program) != first, mode
        assert program_fingerprint(program).startswith(program.command_line()), mode
    gone = Program("script", str(tmp_path / "missing.py"))
    assert program_fingerprint(gone).endswith("(sha256 unreadable)")
