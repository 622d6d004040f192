"""A user's own training script under `kubeddp train`, with real torchrun workers (gloo, CPU).

- examples/ddp_train.py: its report_step calls from 2 workers on the one /metrics of the
  launch (a real scrape, parsed by prometheus_client); SIGTERM -> the script saves its
  snapshot and exits 143, launch exits 143; a rerun resumes from the snapshot and ends with
  the same parameters as an uninterrupted direct `torchrun` run of the same script;
- `--module` with arguments that hold spaces, `--flags` and `${local_rank}`: a script of the
  `torch.distributed.launch` era that parses `--local_rank` runs unchanged;
- a program that fails at once: launch exits with its code after --max-restarts restarts.
"""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeddp.trainer import exit_codes
from tests.helpers import procs, user_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of the endpoint, {} while it does not answer."""
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def both_ranks_reported(url: str) -> dict | None:
    """Both ranks' steps in the per-rank step histogram (metrics.per_rank=true)."""
    metrics = scrape(url)
    counts = [metrics.get(("kubeddp_step_duration_seconds_count", (("rank", r),)), 0) for r in "01"]
    return metrics if metrics.get(("kubeddp_step", ()), 0) >= 4 and min(counts) >= 2 else None


def test_metrics_preemption_and_exact_resume(tmp_path: Path) -> None:
    snapshot = tmp_path / "snapshot.pt"
    argv = procs.kubeddp_argv(
        "train", "--nproc", "2", "--set", "metrics.port=0",
        "--set", "checkpoint.preempt_grace_seconds=30", "--set", "metrics.per_rank=true",
        "--script", str(user_script.SCRIPT),
        *user_script.ARGS, "--snapshot", str(snapshot), "--pause", "0.05",
    )  # fmt: skip
    with procs.started(argv, tmp_path / "first.log") as first:
        url = first.wait_for_output(r"\[kubeddp\] metrics: (http://\S+)", 120).group(1)
        metrics = procs.wait_until(lambda: both_ranks_reported(url), 120, "2 ranks on /metrics")
        assert isinstance(metrics, dict)
        info = [labels for (name, labels) in metrics if name == "kubeddp_info"]
        assert info and ("backend", "gloo") in info[0], info
        assert metrics[("kubeddp_world_size", ())] == 2
        assert metrics[("kubeddp_samples_total", ())] >= 2 * 16 * 2  # both ranks' samples
        assert ("kubeddp_loss", ()) in metrics
        # metrics.per_rank: each rank's phase too (a report_step program sits in `step`)
        phases = {dict(labels)["rank"] for (name, labels), v in metrics.items()
                  if name == "kubeddp_rank_phase" and v == 1}  # fmt: skip
        assert phases == {"0", "1"}, phases
        first.send_signal(signal.SIGTERM)  # as tini / the kubelet would: the launch process
        code = first.wait(90)
    out = first.output()
    assert code == exit_codes.PREEMPTED, first.tail()
    assert out.count("stop_requested() is now true") == 2, first.tail()  # each worker
    saved = re.findall(r"saved snapshot at step (\d+)", out)
    assert saved and snapshot.exists(), first.tail()

    rerun = procs.run(
        procs.kubeddp_argv(
            "train", "--nproc", "2", "--set", "metrics.port=0", "--script",
            str(user_script.SCRIPT), "--", *user_script.ARGS, "--snapshot", str(snapshot),
        ),
        tmp_path / "rerun.log",
        user_script.RUN_SECONDS,
    )  # fmt: skip
    assert rerun.code == 0, rerun.output[-3000:]
    assert f"resuming from step {saved[-1]} " in rerun.output
    assert user_script.digest(rerun.output) == user_script.torchrun_digest(2)


def test_module_arguments_and_local_rank_macro(tmp_path: Path) -> None:
    """`--module`, run from the script's folder: the launch-era script gets --local_rank from
    `${local_rank}`, and every other argument exactly as written."""
    args = ["--local_rank=${local_rank}", "--note", "two words, $HOME $$ 'quoted'", "--extra=1"]
    done = procs.run(
        procs.kubeddp_argv(
            "train", "--nproc", "2", "--module", user_script.LAUNCH_ERA_SCRIPT.stem, "--", *args
        ),
        tmp_path / "module.log",
        user_script.RUN_SECONDS,
        cwd=user_script.EXAMPLES,
    )
    assert done.code == 0, done.output[-3000:]
    # Two workers share the log: a line of one may end up next to the other's on one line.
    seen = [json.loads(m) for m in re.findall(r"launch-era worker: (\{[^{}]*\})", done.output)]
    assert sorted((s["rank"], s["local_rank"]) for s in seen) == [(0, 0), (1, 1)]
    assert {s["note"] for s in seen} == {"two words, $HOME $$ 'quoted'"}
    assert all(s["unknown"] == ["--extra=1"] for s in seen)


def test_program_that_fails_at_once_is_restarted_only_max_restarts_times(tmp_path: Path) -> None:
    failing = tmp_path / "fail.py"
    failing.write_text(
        "import os, sys\n"
        "print('started round', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n"
        "sys.exit(1)\n"
    )
    done = procs.run(
        procs.kubeddp_argv(
            "train", "--nproc", "2", "--max-restarts", "1", "--script", str(failing)
        ),
        tmp_path / "fail.log",
        user_script.RUN_SECONDS,
    )
    assert done.code == exit_codes.TRAINING_FAILED, done.output[-3000:]
    # The first start and one restart. Not a count of lines: the agent stops a worker that
    # has not printed yet as soon as its peer fails.
    rounds = set(re.findall(r"started round (\d+)", done.output))
    assert rounds == {"0", "1"}, done.output[-3000:]
    assert "training failed (worker exit code 1)" in done.output


def test_launch_era_script_takes_the_torch_2_spelling(tmp_path: Path) -> None:
    """torch 2.x's torch.distributed.launch passes `--local-rank`: the example takes it too."""
    done = procs.run(
        procs.kubeddp_argv(
            "train", "--nproc", "2", "--script", str(user_script.LAUNCH_ERA_SCRIPT), "--",
            "--local-rank=${local_rank}", "--steps", "2",
        ),
        tmp_path / "dash.log",
        user_script.RUN_SECONDS,
    )  # fmt: skip
    assert done.code == 0, done.output[-3000:]
    seen = [json.loads(m) for m in re.findall(r"launch-era worker: (\{[^{}]*\})", done.output)]
    assert sorted((s["rank"], s["local_rank"]) for s in seen) == [(0, 0), (1, 1)]
