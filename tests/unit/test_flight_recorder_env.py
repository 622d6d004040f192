"""torch's flight recorder size as launch gives it to its workers: the user's own setting under
either of torch's names wins (0 too: the recorder off); kubeddp's 2000 applies only when
neither is set, under the name the installed torch reads (TORCH_NCCL_TRACE_BUFFER_SIZE before
2.8; TORCH_FR_BUFFER_SIZE from 2.8, which wins over the old name there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubeddp.trainer.config import load_config
from kubeddp.trainer.launcher.stall_watch import StallWatch
from kubeddp.trainer.process_contract import (
    ENV_FR_BUFFER,
    ENV_FR_BUFFER_BEFORE_2_8,
    fr_buffer_default,
    fr_buffer_size,
)

pytestmark = pytest.mark.timeout(120)

NEW, OLD = ENV_FR_BUFFER, ENV_FR_BUFFER_BEFORE_2_8
# (user's env, torch version) -> (what kubeddp adds, the size that torch then reads)
CASES = {
    "nothing set, torch 2.13": ({}, "2.13.0+cpu", {NEW: "2000"}, 2000),
    "nothing set, torch 2.8": ({}, "2.8.0", {NEW: "2000"}, 2000),
    "nothing set, torch 2.7": ({}, "2.7.1", {OLD: "2000"}, 2000),
    "nothing set, torch 2.4": ({}, "2.4.1+cu121", {OLD: "2000"}, 2000),
    "nothing set, NVIDIA's 2.6 build": ({}, "2.6.0a0+ecf3bae40a.nv25.01", {OLD: "2000"}, 2000),
    "nothing set, a nightly of 2.16": ({}, "2.16.0a0+git1", {NEW: "2000"}, 2000),
    "nothing set, no metadata": ({}, None, {NEW: "2000"}, 2000),
    "old name 0, torch 2.13": ({OLD: "0"}, "2.13.0", {}, 0),
    "old name 0, torch 2.4": ({OLD: "0"}, "2.4.1", {}, 0),
    "old name 500, torch 2.13": ({OLD: "500"}, "2.13.0", {}, 500),
    "new name 0, torch 2.13": ({NEW: "0"}, "2.13.0", {}, 0),
    "new name 300, torch 2.13": ({NEW: "300"}, "2.13.0", {}, 300),
    "new name 300, torch 2.7 (not read there)": ({NEW: "300"}, "2.7.1", {}, 0),
    "both set, torch 2.13 reads the new": ({NEW: "10", OLD: "0"}, "2.13.0", {}, 10),
    "both set, torch 2.7 reads the old": ({NEW: "10", OLD: "0"}, "2.7.1", {}, 0),
    "not a number": ({OLD: "lots"}, "2.13.0", {}, 0),
}


@pytest.mark.parametrize("case", CASES)
def test_the_users_setting_wins_and_the_default_uses_torchs_name(case: str) -> None:
    env, torch_version, added, size = CASES[case]
    assert fr_buffer_default(env, torch_version) == added
    assert fr_buffer_size({**env, **added}, torch_version) == size


def test_the_stall_watch_gives_the_workers_the_default_only_when_nothing_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(None, [f"checkpoint.dir={tmp_path}"])
    monkeypatch.delenv(NEW, raising=False)
    monkeypatch.delenv(OLD, raising=False)
    watch = StallWatch(cfg.diagnostics, cfg.checkpoint.dir, print)
    try:
        assert watch.env.get(NEW) == "2000" and OLD not in watch.env  # torch 2.13 here
        monkeypatch.setenv(OLD, "0")
        assert NEW not in watch.env and OLD not in watch.env
    finally:
        watch.remove()


RECORDER = """
import json, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
for _ in range(3):
    dist.all_reduce(torch.ones(2))
print(len(json.loads(c10d._dump_fr_trace_json()).get("entries", [])))
dist.destroy_process_group()
"""


@pytest.mark.parametrize(("user", "recording"), [({}, True), ({OLD: "0"}, False)], ids=str)
def test_the_installed_torch_records_as_the_composed_env_says(
    user: dict[str, str], recording: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real recorder of this torch, in a worker whose env is the user's plus what the stall
    watch adds: on by kubeddp's default, off by the user's 0 under the old name (which kubeddp
    once overrode with the new one)."""
    for name in (NEW, OLD):
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    cfg = load_config(None, [f"checkpoint.dir={tmp_path}"])
    watch = StallWatch(cfg.diagnostics, cfg.checkpoint.dir, print)
    try:
        env = {**os.environ, **watch.env}
    finally:
        watch.remove()
    done = subprocess.run([sys.executable, "-c", RECORDER], env=env, capture_output=True,
                          text=True, timeout=90)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    entries = json.loads(done.stdout.strip().splitlines()[-1])
    assert (entries > 0) is recording, (entries, user)
