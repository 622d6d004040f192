"""`kubeddp completion bash|zsh|fish`: the bash script, run by a real bash, completes the
commands and each command's options (torchrun's spellings for train included); the others are
made from the same table and checked by their shell where one is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from kubeddp.tools.cli import completion
from kubeddp.tools.cli.main import build_parser

pytestmark = pytest.mark.timeout(60)


def kubeddp(*argv: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from kubeddp.tools.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60
    )


def complete_in_bash(words: list[str]) -> list[str]:
    """COMPREPLY for the command line `words` (the last one being completed)."""
    script = kubeddp("completion", "bash").stdout
    words_array = " ".join(f"'{w}'" for w in words)
    probe = (
        f"{script}\nCOMP_WORDS=({words_array}); COMP_CWORD={len(words) - 1}; "
        '_kubeddp; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_commands() -> None:
    assert complete_in_bash(["kubeddp", "re"]) == ["render"]
    assert {"train", "status", "completion"} <= set(complete_in_bash(["kubeddp", ""]))


def test_bash_completes_options_of_each_command() -> None:
    assert "--nproc_per_node" in complete_in_bash(["kubeddp", "train", "--nproc"])
    assert complete_in_bash(["kubeddp", "status", "demo", "--out"]) == ["--output"]
    assert complete_in_bash(["kubeddp", "completion", "f"]) == ["fish"]


def test_every_command_is_in_the_table() -> None:
    table = completion.commands(build_parser())
    assert {"render", "validate", "submit", "train", "launch", "status", "wait"} <= set(table)
    assert "--gpus-per-node" in table["render"]


def test_train_completes_what_its_parser_takes_without_importing_torch() -> None:
    """Every option of `kubeddp train` (torchrun's read from its source), and a completion
    script made without torch: a shell may make it at every start."""
    from kubeddp.trainer.launcher.launch import train_parser

    table = completion.commands(build_parser())
    assert table["train"] == sorted({o for a in train_parser()._actions for o in a.option_strings})
    probe = (
        "import sys\nfrom kubeddp.tools.cli.main import main\nmain(['completion', 'bash'])\n"
        "assert 'torch' not in sys.modules, 'completion imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and "--local-ranks-filter" in done.stdout, done.stderr


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_other_shells_parse_their_script(shell: str, tmp_path) -> None:
    done = kubeddp("completion", shell)
    assert done.returncode == 0 and "kubeddp" in done.stdout
    binary = shutil.which(shell)
    if binary is None:
        pytest.skip(f"{shell} is not installed here; its script was made but not parsed")
    path = tmp_path / f"kubeddp.{shell}"
    path.write_text(done.stdout)
    checked = subprocess.run([binary, "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_unknown_shell_is_one_line() -> None:
    done = kubeddp("completion", "tcsh")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
