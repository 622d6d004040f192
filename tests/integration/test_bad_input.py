"""Bad config and bad env through the real CLI: a non-zero exit and one error line, no traceback.

The config is checked by `kubeddp launch` before it waits for the master or starts torchrun, so
a typo fails in about a second with one line instead of one traceback per worker.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from tests.helpers import bad_inputs, fake_api, mounts, procs
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(120)
UNRESOLVABLE = "demo-master-0.kubeddp-test.invalid"
ENV_KEEP = ("PATH", "HOME", "LANG", "PYTHONPATH")


def run_cli(tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> procs.Finished:
    """`kubeddp ARGS` with only `env` (plus PATH/HOME/...) set: no rendezvous vars leak in."""
    full_env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    full_env.update(env or {})
    log = tmp_path / f"cli-{len(list(tmp_path.glob('cli-*.log')))}.log"
    return procs.run(procs.kubeddp_argv(*args), log, timeout=90, env=full_env)


def error_lines(output: str) -> list[str]:
    assert "Traceback" not in output, output
    return [line for line in output.splitlines() if line.startswith("kubeddp") and "error" in line]


def assert_one_error(done: procs.Finished, code: int, *mentions: str) -> str:
    assert done.code == code, done.output
    lines = error_lines(done.output)
    assert len(lines) == 1, done.output
    for word in mentions:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    return lines[0]


CONFIG_FILES = {
    "malformed yaml": ("train:\n  lr: [0.1\n", ["not valid YAML", "line 2"]),
    "unknown key": ("train:\n  learning_rate: 0.1\n", ["'train.learning_rate'", "known here"]),
    "wrong type": ("train:\n  batch_size: 1.5\n", ["'train.batch_size'", "int", "1.5"]),
    "bad enum": ("ddp:\n  backend: mpi\n", ["'ddp.backend'", "'mpi'", "nccl, gloo"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_FILES))
def test_bad_config_file(case, tmp_path: Path) -> None:
    text, mentions = CONFIG_FILES[case]
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    done = run_cli(tmp_path, ["train", "--nproc", "2", "--config", str(path)])
    assert_one_error(done, 2, "kubeddp train: error:", *mentions)


@pytest.mark.parametrize(
    "override,mentions",
    [
        ("train.lr", ["'train.lr'", "section.key=value"]),
        ("lr=0.1", ["'lr=0.1'", "section.key"]),
        ("train.optimizer=lamb", ["'lamb'", "adamw, sgd"]),
        ("checkpoint.keep=zero", ["'checkpoint.keep'", "'zero'"]),
    ],
)
def test_bad_set(override, mentions, tmp_path: Path) -> None:
    done = run_cli(tmp_path, ["train", "--nproc", "2", "--set", override])
    assert_one_error(done, 2, *mentions)


def test_unreadable_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    done = run_cli(tmp_path, ["launch", "--", "--config", str(missing)])
    assert_one_error(done, 2, f"cannot read config file {missing}", "No such file")
    done = run_cli(tmp_path, ["launch", "--", "--config", str(tmp_path)])
    assert_one_error(done, 2, f"cannot read config file {tmp_path}")


def test_bad_config_from_env_variable(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("metrics:\n  prot: 9400\n")
    done = run_cli(tmp_path, ["launch"], env={"KUBEDDP_CONFIG": str(path)})
    assert_one_error(done, 2, "'metrics.prot'")


def worker_pod_env(master_addr: str, port: int) -> dict[str, str]:
    """Worker-0 of PyTorchJob `demo` (Master 1 + Worker 1, nprocPerNode 1), per the CSV."""
    return {
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": master_addr,
        "PET_MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "PET_MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "RANK": "1",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "1",
        "PET_NNODES": "2",
    }


# The rendezvous host not up in time is another pod's state, not this one's mistake: the
# retryable RDZV_UNREACHABLE, so ExitCode/podFailurePolicy retry the pod.
def test_unresolvable_master_exits_retryable(tmp_path: Path) -> None:
    done = run_cli(tmp_path, ["launch", "--rdzv-wait", "3"], worker_pod_env(UNRESOLVABLE, 23456))
    assert exit_codes.RDZV_UNREACHABLE >= exit_codes.RETRYABLE_FROM
    assert_one_error(
        done, exit_codes.RDZV_UNREACHABLE, f"{UNRESOLVABLE}:23456 does not resolve after 3s",
        "kubectl get", "200 (rendezvous host unreachable, retryable)",
    )  # fmt: skip


def test_master_name_resolves_but_port_closed_exits_retryable(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    done = run_cli(tmp_path, ["launch", "--rdzv-wait", "3"], worker_pod_env("localhost", port))
    message = f"localhost:{port} does not accept on port {port} after 3s"
    assert_one_error(done, exit_codes.RDZV_UNREACHABLE, message)


def test_bad_wait_seconds_env(tmp_path: Path) -> None:
    env = {**worker_pod_env("localhost", 23456), "KUBEDDP_RDZV_WAIT_SECONDS": "ten"}
    done = run_cli(tmp_path, ["launch"], env)
    assert_one_error(done, 2, "KUBEDDP_RDZV_WAIT_SECONDS='ten'")


def test_inconsistent_env_without_dry_run(tmp_path: Path) -> None:
    env = {**worker_pod_env("localhost", 23456), "WORLD_SIZE": "3"}
    done = run_cli(tmp_path, ["launch"], env)
    assert_one_error(done, 2, "WORLD_SIZE=3", "PET_NNODES=2")


@pytest.mark.slow
def test_missing_corpus_is_one_line_per_rank(tmp_path: Path) -> None:
    # Found only when the workers build the workload: no traceback, exit 2, one line per rank.
    args = ["train", "--nproc", "2", "--set", "workload.corpus=/nonexistent/corpus.txt"]
    args += ["--set", f"checkpoint.dir={tmp_path / 'ckpt'}", "--set", "metrics.port=0"]
    done = run_cli(tmp_path, args)
    assert done.code == 2, done.output
    lines = error_lines(done.output)
    assert sorted(line.split(":")[1] for line in lines) == [" error (rank 0)", " error (rank 1)"]
    assert all("'/nonexistent/corpus.txt' is not a file or directory" in line for line in lines)


# One row of each kind of the bad-input table (tests/helpers/bad_inputs.py, all of which run in
# process in tests/unit/test_bad_inputs.py) as a real process: what the user sees, including
# anything a library prints on its own (warnings, retry logs) and the interpreter's exit.
SUBPROCESS_ROWS = (
    "set-train.max_steps-below-min",
    "train-workload.n_head=0",
    "train-config-laughs",
    "train-config-binary",
    "render-config-deep-flow",
    "validate-duplicate-key",
    "validate-metadata-list",
    "validate-list-items-number",
    "env-trainjob-without-nnodes",
    "env-elastic-port-too-big",
    "env-rdzv-wait-nan",
    "rdzv-wait-nan",
    "delete-name-traversal",
    "status-name-query",
    "kubeconfig-server-not-a-url",
    "kubeconfig-laughs",
    "api-reset-status",
    "api-html-delete",
    "api-hang-status",
    "api-500-submit",
)
ROWS = {row.id: row for row in bad_inputs.all_rows()}


# Issue 24's classes, each where the fault needs a real process: a launcher that must not run
# the user's module, a stdout that is /dev/full, closed or a pipe without reader, a FIFO, a
# server that drips its answer.
SUBPROCESS_ROWS += (
    "module-file-typo",
    "module-file-typo-dry-run",
    "module-package-without-main",
    "flag-master-addr-with-port",
    "flag-master-addr-empty",
    "flag-master-addr-space",
    "flag-rdzv-endpoint-no-port",
    "flag-master-port-zero",
    "flag-nproc-huge",
    "flag-nnodes-huge",
    "launch-env-rdzv-conf-malformed",
    "launch-env-rdzv-backend-unknown",
    "render-stdout-full",
    "render-stdout-closed",
    "render-stdout-broken-pipe",
    "submit-client-stdout-broken-pipe",
    "train-dry-run-stdout-full",
    "env-reserved-KUBEDDP_NNODES",
    "env-secret-reserved-LOCAL_RANK",
    "render-env-secret-digit-name",
    "render-nodes-above-int32",
    "train-config-fifo",
    "script-config-trainer-key",
    "submit-file-empty",
    "api-empty-object-submit",
    "api-wrong-kind-status",
    "api-deep-status",
    "api-drip-status",
)
TRAINING_ROWS = tuple(row.id for row in bad_inputs.all_rows() if row.training)


def run_row(row: bad_inputs.Row, tmp_path: Path) -> tuple[procs.Split, list]:
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.update({"HOME": str(tmp_path), "KUBEDDP_DRY_RUN_GPUS": "0", **row.env})
    for name, content in row.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    for name in row.fifos:
        os.mkfifo(tmp_path / name)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in row.argv]
    cwd = tmp_path if row.in_tmp else None
    with fake_api.running() as server:
        server.misbehaviour = None if row.api in (None, "ok") else row.api
        if row.api is not None and "--kubeconfig" not in argv:
            kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig", server.url)
            argv += ["--kubeconfig", str(kubeconfig), "--request-timeout", "1"]
        done = procs.run_split(procs.kubeddp_argv(*argv), tmp_path, timeout=90, env=env,
                               cwd=cwd, stdout=row.stdout)  # fmt: skip
        requests = list(server.requests)
    for name in row.must_not_exist:
        assert not (tmp_path / name).exists(), "the user's code ran in the launcher"
    return done, requests


@pytest.mark.parametrize("row_id", SUBPROCESS_ROWS)
def test_bad_input_row_as_a_process(row_id: str, tmp_path: Path) -> None:
    row = ROWS[row_id]
    done, requests = run_row(row, tmp_path)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = bad_inputs.error_lines(row, done.stderr)
    assert done.code == row.code, f"exit {done.code}, want {row.code}\n{done.stderr}"
    assert len(lines) == 1, done.stderr
    for word in row.mentions:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    if row.api_untouched:
        assert requests == [], requests


def test_compile_on_without_a_compiler(tmp_path: Path) -> None:
    """A slim image (no g++ on PATH, no $CXX) with train.compile=on: one line before any
    rendezvous, instead of an inductor traceback per worker at the first step."""
    bare_path = tmp_path / "bin"
    bare_path.mkdir()
    done = run_cli(
        tmp_path,
        ["train", "--nproc", "2", "--set", "train.compile=on"],
        env={"PATH": str(bare_path)},
    )
    assert_one_error(
        done,
        2,
        "kubeddp train: error:",
        "train.compile=on needs a C++ compiler for inductor",
        "train.compile=off",
    )
    assert "rendezvous" not in done.output  # refused before the launcher planned anything


@pytest.mark.timeout(180)
@pytest.mark.parametrize("row_id", TRAINING_ROWS)
def test_user_program_row(row_id: str, tmp_path: Path) -> None:
    """A real run of the user's program (2 gloo workers): the exit class is the program's, said
    in one kubeddp line; a bad call to kubeddp.api or another process's half-written metrics
    file never ends the program."""
    row = ROWS[row_id]
    done, _ = run_row(row, tmp_path)
    assert done.code == row.code, f"exit {done.code}, want {row.code}\n{done.stderr}"
    lines = done.stderr.splitlines()
    if row.code == exit_codes.OK:
        assert "Traceback" not in done.stderr, done.stderr
        assert "the program went on" in done.stdout, done.stdout
        assert not [line for line in lines if ": error" in line], done.stderr
        said = [line for line in lines if "kubeddp.api" in line]
        # the same warning from each of the two workers, once each, never repeated
        assert all(all(w in line for w in row.mentions) for line in said), done.stderr
        assert len(said) == (2 if row.mentions else 0), done.stderr
        return
    said = [line for line in lines if all(word in line for word in row.mentions)]
    assert len(said) >= 1, done.stderr
    last = [line for line in lines if line.startswith(("kubeddp", "[kubeddp]"))][-1]
    assert f"exit code {row.code} (" in last or row.code == exit_codes.BAD_INPUT, last


@pytest.mark.parametrize(("state", "says"), [("read-only", "read-only filesystem"),
                                             ("full", "is full (0 bytes")])  # fmt: skip
def test_a_read_only_or_full_tmp_is_one_line(state: str, says: str, tmp_path: Path) -> None:
    """Each worker met it on its own before: a traceback (1), SIGBUS (135) or an internal
    error (4). Now launch says it once, before anything starts: fatal, as a retry on the same
    mount would meet it again."""
    argv = procs.kubeddp_argv("train", "--nproc", "2", "--set", "workload.name=regression")
    own_tmp = mounts.with_own_tmp(argv, readonly=state == "read-only", full=state == "full")
    done = procs.run(own_tmp, tmp_path / "train.log", timeout=90, env=procs.child_env())
    line = assert_one_error(done, exit_codes.BAD_INPUT, "the scratch directory /tmp", says)
    assert line.startswith("kubeddp train: error: ") and "mount a writable /tmp" in line
    assert "rendezvous:" not in done.output, done.output
