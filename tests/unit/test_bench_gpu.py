"""The GPU bench's bookkeeping, on made-up step times: arm order, steady-state windows, the
time budget, ratios, compile time and the table; its FLOP count and matmul peak.
(tests/integration/test_bench_smoke.py runs it on a tiny size.)"""

from __future__ import annotations

import math

import pytest
import torch

from kubeddp.trainer.workloads.charlm import TRAIN_FRACTION, VOCAB_SIZE, CharGPT
from tests.bench import gpu
from tests.bench.gpu_flops import charlm_train_flops_per_token, measure_matmul_peak
from tests.bench.gpu_report import GpuReport
from tests.bench.gpu_runs import (
    HAND,
    SKIPPED_BUDGET,
    WINDOW,
    ArmResult,
    plan,
    steady_windows,
)

PEAK = 1e15


def arms_by_key():
    arms = plan(gpu.GPT2_SMALL, gpu.DEMO, 10, 120)
    return {arm.key: arm for arm in arms}


def fake_result(arm, step_seconds: float, first_step_at: float) -> ArmResult:
    """A run launched at t=1000 whose first step ends after `first_step_at` s, then one step
    every `step_seconds`."""
    start = 1000.0
    ends = [start + first_step_at + i * step_seconds for i in range(arm.steps)]
    m = arm.model.charlm
    tokens = m.batch_size * m.seq_len
    return ArmResult(
        arm,
        "ok",
        start_unix=start,
        wall_seconds=first_step_at + arm.steps * step_seconds + 3,
        step_end_unix=ends,
        tokens_per_step=tokens,
        max_memory_bytes=3 * 1024**3 if arm.trainer == HAND else None,
        window_tokens_per_s=steady_windows(ends, arm.warmup, tokens),
    )


def test_the_most_important_arms_come_first() -> None:
    keys = [arm.key for arm in plan(gpu.GPT2_SMALL, gpu.DEMO, 10, 120)]
    assert keys[:5] == [
        "12x768:hand-written:eager:bf16",
        "12x768:kubeddp:eager:bf16",
        "12x768:kubeddp:eager:fp32",
        "12x768:kubeddp:compiled:bf16",
        "12x768:hand-written:compiled:bf16",
    ]
    assert keys[5:] == [
        "demo:hand-written:eager:bf16",
        "demo:kubeddp:eager:bf16",
        "demo:kubeddp:compiled:bf16",
        "demo:hand-written:compiled:bf16",
        "demo:kubeddp:eager:fp32",
    ]


@pytest.mark.parametrize("model", [gpu.GPT2_SMALL, gpu.DEMO])
def test_every_arm_stays_inside_one_epoch(model) -> None:
    """An epoch end means evaluation and, compiled, recompilation: never inside the timing."""
    m = model.charlm
    windows = int(m.corpus_max_bytes * TRAIN_FRACTION) // m.seq_len
    steps_per_epoch = windows // m.batch_size  # full batches only
    for arm in plan(model, None, gpu.GPU_SIZES.warmup, gpu.GPU_SIZES.measured):
        assert arm.steps < steps_per_epoch, arm.key
        assert arm.warmup % WINDOW == 0 and arm.measured % WINDOW == 0, arm.key


def test_windows_start_after_warmup_and_end_on_synced_steps() -> None:
    ends = [float(i) for i in range(1, 41)]  # step i ends at t=i; 2 tokens per step
    ends[4] = 100.0  # a stall inside warm-up (step 5) must not count
    assert steady_windows(ends, 10, 2) == [2.0, 2.0, 2.0]
    ends[24] += 5  # a stall inside the second window slows only that window
    assert steady_windows(ends, 10, 2) == [2.0, 2.0, 2.0]  # step 25's end is no window edge
    ends[29] += 5  # step 30 is an edge: windows 2 and 3 change
    assert steady_windows(ends, 10, 2) == [2.0, 20 / 15, 20 / 5]


def test_a_spent_budget_skips_every_arm_without_running_it(tmp_path) -> None:
    arms = plan(gpu.TINY, None, 10, 20)
    results, seconds = gpu.run_arms(arms, "cpu", tmp_path, gpu.GPU_SIZES, 0.0, lambda _: None)
    assert [r.status for r in results] == [SKIPPED_BUDGET] * len(arms)
    assert seconds < 1 and not any(tmp_path.iterdir())


def test_estimates_learn_from_finished_runs() -> None:
    arms = arms_by_key()
    sizes = gpu.GPU_SIZES
    k_eager = arms["12x768:kubeddp:eager:bf16"]
    k_comp = arms["12x768:kubeddp:compiled:bf16"]
    assert gpu.estimate_seconds(k_eager, [], sizes) == sizes.eager_guess
    assert gpu.estimate_seconds(k_comp, [], sizes) == sizes.eager_guess + sizes.compile_guess
    hand = fake_result(arms["12x768:hand-written:eager:bf16"], 0.05, 10.0)
    assert gpu.estimate_seconds(k_comp, [hand], sizes) == hand.wall_seconds + sizes.compile_guess
    compiled = fake_result(k_comp, 0.04, 50.0)
    assert gpu.estimate_seconds(k_comp, [hand, compiled], sizes) == compiled.wall_seconds
    # The demo's compiled arm: its own eager run plus what compiling added on the big model.
    demo_comp = arms["demo:kubeddp:compiled:bf16"]
    demo_eager = fake_result(arms["demo:hand-written:eager:bf16"], 0.005, 8.0)
    added = compiled.wall_seconds - hand.wall_seconds
    assert gpu.estimate_seconds(demo_comp, [hand, compiled, demo_eager], sizes) == (
        pytest.approx(demo_eager.wall_seconds + added)
    )


def test_report_ratios_mfu_compile_time_and_table() -> None:
    arms = arms_by_key()
    runs = {
        "12x768:hand-written:eager:bf16": (0.050, 9.0),
        "12x768:kubeddp:eager:bf16": (0.055, 11.0),
        "12x768:kubeddp:eager:fp32": (0.110, 11.0),
        "12x768:kubeddp:compiled:bf16": (0.040, 41.0),
    }
    results = [fake_result(arms[key], *timing) for key, timing in runs.items()]
    results.append(ArmResult(arms["12x768:hand-written:compiled:bf16"], SKIPPED_BUDGET))
    report = GpuReport([gpu.GPT2_SMALL], results, PEAK, "Test GPU", 220.0, 200.0)
    by_name = {row.name.split(": ", 1)[1]: row for row in report.rows()}

    assert by_name["kubeddp / hand-written loop, eager bf16"].ratio == pytest.approx(50 / 55)
    assert by_name["kubeddp / hand-written loop, eager bf16"].status == "MISSES goal"
    assert by_name["bf16 / fp32 speedup, kubeddp eager"].ratio == pytest.approx(2.0)
    assert by_name["compiled / eager, kubeddp bf16"].ratio == pytest.approx(55 / 40)
    missing = by_name["kubeddp / hand-written loop, compiled bf16"]
    assert missing.ratio is None and SKIPPED_BUDGET in missing.note

    m = gpu.GPT2_SMALL.charlm
    flops = charlm_train_flops_per_token(m.n_layer, m.n_embd, m.seq_len, VOCAB_SIZE)
    mfu = by_name["model FLOPs utilisation, kubeddp, compiled, bf16"]
    assert mfu.ratio == pytest.approx(flops * m.batch_size * m.seq_len / 0.040 / PEAK)
    assert mfu.goal == ">= 0.40"

    compiled = next(r for r in results if r.arm.key == "12x768:kubeddp:compiled:bf16")
    # first timed step = step 20: 41 + 19 * 0.040 vs the eager run's 11 + 19 * 0.055
    expected = (41 + 19 * 0.040) - (11 + 19 * 0.055)
    assert report.compile_seconds(compiled) == pytest.approx(expected)
    assert report.compile_seconds(results[0]) is None

    table = report.table()
    assert "0.91x hand-written" in table and "bf16 2.00x" in table
    assert f"{expected:.1f} s" in table
    assert "3.00 GiB" in table and "not measured" in table
    skipped_line = next(line for line in table.splitlines() if SKIPPED_BUDGET in line)
    assert "hand-written, compiled, bf16" in skipped_line
    data = report.to_dict()
    assert [a["status"] for a in data["arms"]] == ["ok"] * 4 + [SKIPPED_BUDGET]
    assert math.isclose(data["arms"][3]["compile_seconds"], expected)


def test_flops_formula_counts_every_matmul_weight_of_the_real_model() -> None:
    n_layer, n_embd, seq_len = 2, 64, 32
    model = CharGPT(VOCAB_SIZE, seq_len, n_layer, 4, n_embd, 0.0)
    linear_weights = sum(
        m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)
    )
    attention = 4 * n_layer * seq_len * n_embd  # scores + weighted sum, forward, per token
    expected = 3 * (2 * linear_weights + attention)
    assert charlm_train_flops_per_token(n_layer, n_embd, seq_len, VOCAB_SIZE) == expected


def test_matmul_peak_runs_on_cpu() -> None:
    peak = measure_matmul_peak(torch.device("cpu"), torch.float32, n=64, iters=2)
    assert math.isfinite(peak) and peak > 0
