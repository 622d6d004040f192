"""Each built-in workload learns in a real 2-process gloo run (`kubeddp train --nproc 2`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import procs

DONE_RE = re.compile(r"^done: (\d+) steps .*\| final loss ([\d.]+) \(start ([\d.]+)\)", re.M)
RUN_TIMEOUT_SECONDS = 240


def train(tmp_path: Path, name: str, *settings: str) -> tuple[int, float, float, str]:
    """Run `kubeddp train --nproc 2`; return (steps, final loss, start loss, output)."""
    argv = procs.kubeddp_argv("train", "--nproc", "2")
    for s in (f"checkpoint.dir={tmp_path / 'ckpt'}", "metrics.port=0", *settings):
        argv += ["--set", s]
    done = procs.run(argv, tmp_path / f"{name}.log", RUN_TIMEOUT_SECONDS)
    assert done.code == 0, done.output[-4000:]
    assert "world size 2 (gloo, cpu)" in done.output
    assert "[kubeddp] finished" in done.output
    found = DONE_RE.search(done.output)
    assert found, done.output[-4000:]
    return int(found[1]), float(found[2]), float(found[3]), done.output


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_regression_learns(tmp_path: Path) -> None:
    steps, final, start, _ = train(
        tmp_path,
        "regression",
        "workload.name=regression",
        "train.epochs=3",
        "train.max_steps=60",
        "train.log_every=20",
    )
    assert steps == 60
    assert final < 0.7 * start, f"loss {start} -> {final}"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_charlm_learns_on_a_small_corpus(tmp_path: Path) -> None:
    sentence = "the quick brown fox jumps over the lazy dog while a small cat sleeps"
    words = sentence.split(" ")
    lines = [" ".join(words[i % len(words) :] + words[: i % len(words)]) for i in range(400)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    steps, final, start, output = train(
        tmp_path,
        "charlm",
        "workload.name=charlm",
        f"workload.corpus={corpus}",
        "workload.seq_len=32",
        "workload.n_layer=1",
        "workload.n_head=2",
        "workload.n_embd=32",
        "train.batch_size=16",
        "train.lr=0.01",
        "train.epochs=5",
        "train.max_steps=40",
        "train.log_every=20",
    )
    assert steps == 40
    assert str(corpus) in output  # the run read the given corpus, not the stdlib
    assert final < 0.8 * start, f"loss {start} -> {final}"
