"""Communication rows: gloo all_reduce bandwidth and the DDP step's exposed communication."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.bench_trainer import CharLM
from tests.bench.common import BENCH_DIR, Row, bench_env, run_job, torchrun_cmd


def bench_comm(
    work: Path, sizes_mb: list[float], iters: int, model: CharLM, steps: int, timeout: float
) -> list[Row]:
    out = work / "comm.json"
    args = [
        f"--out={out}",
        "--sizes-mb=" + ",".join(str(s) for s in sizes_mb),
        f"--iters={iters}",
        f"--steps={steps}",
        f"--n-layer={model.n_layer}",
        f"--n-head={model.n_head}",
        f"--n-embd={model.n_embd}",
        f"--seq-len={model.seq_len}",
        f"--batch-size={model.batch_size}",
    ]
    run_job(
        torchrun_cmd(2, BENCH_DIR / "comm_worker.py", args), bench_env(), work / "comm.log", timeout
    )
    result = json.loads(out.read_text())
    rows = []
    for item in result["bandwidth"]:
        bus, copy = item["bus_bytes_per_s"], item["copy_bytes_per_s"]
        rows.append(
            Row(
                "communication",
                f"gloo all_reduce bus bandwidth, {item['size_mb']:g} MB",
                bus / copy,
                "memory copy of the same size (torch copy_, same moment)",
                f"{bus / 1e9:.2f} vs {copy / 1e9:.2f} GB/s",
                "",
                f"2 processes on loopback; all_reduce {item['all_reduce_s'] * 1000:.2f} ms",
            )
        )
    ddp = result["ddp"]
    exposed = max(0.0, ddp["exposed_s"])
    rows.append(
        Row(
            "communication",
            "DDP exposed communication / raw all_reduce of all gradients",
            exposed / ddp["raw_all_reduce_s"],
            "one all_reduce of a flat buffer of every gradient",
            f"{exposed * 1000:.1f} ms exposed, {ddp['raw_all_reduce_s'] * 1000:.1f} ms raw, "
            f"{ddp['grad_bytes'] / 2**20:.1f} MB",
            "",
            f"{model.describe()}; exposed = step {ddp['step_s'] * 1000:.1f} ms - compute-only "
            f"(no_sync) {ddp['compute_only_s'] * 1000:.1f} ms; below 1 = overlapped with backward",
        )
    )
    return rows
