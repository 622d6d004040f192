"""GPU bench: charlm through `kubeddp train` on one CUDA device (NCCL, world size 1, bf16
autocast); tokens/s and model FLOPs utilisation against this card's measured matmul peak.

    python -m tests.bench.gpu                 # on a CUDA machine; prints a skip line on CPU
    python -m tests.bench.gpu --device cpu --tiny   # the same path on CPU, tiny (smoke test)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from kubeddp.trainer.workloads.charlm import VOCAB_SIZE
from tests.bench.bench_trainer import CharLM, run_kubeddp
from tests.bench.common import BenchError, Row, not_measured

GPU_MODEL = CharLM(n_layer=6, n_embd=384, batch_size=64, seq_len=256, n_head=6)
TINY_MODEL = CharLM(n_layer=1, n_embd=32, batch_size=4, seq_len=32, corpus_max_bytes=20_000)
NO_CUDA = "no CUDA device visible; run `python -m tests.bench.gpu` on a GPU machine"


def charlm_train_flops_per_token(n_layer: int, n_embd: int, seq_len: int, vocab: int) -> float:
    """Training FLOPs per token of CharGPT (forward + backward = 3 x forward).

    Forward matmuls: 2 FLOPs per weight per token; a block holds 12 d^2 weights (qkv 3d^2,
    out-proj d^2, MLP 8d^2) and the tied head d*vocab. Attention scores and the weighted sum
    add 2 * 2 * seq_len * d per layer per token (the causal mask's skipped half is counted,
    as is usual for MFU, so figures compare with published ones). Embedding lookups,
    LayerNorm and softmax are not matmuls and are left out.
    """
    matmul_weights = 12 * n_layer * n_embd**2 + n_embd * vocab
    forward = 2 * matmul_weights + 4 * n_layer * seq_len * n_embd
    return 3.0 * forward


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, n: int, iters: int) -> float:
    """Best FLOP/s of an n x n x n matmul on `device`: the practical peak MFU is scored against."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        for _ in range(5):
            torch.matmul(a, b, out=out)
        _sync(device)
        best = min(best, (time.perf_counter() - start) / 5)
    return 2.0 * n**3 / best


def bench_gpu(work: Path, device_name: str, tiny: bool, timeout: float = 600.0) -> list[Row]:
    device = torch.device(device_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        return [not_measured("gpu", "charlm model FLOPs utilisation (bf16, NCCL)", NO_CUDA)]
    model = TINY_MODEL if tiny else GPU_MODEL
    on_cuda = device.type == "cuda"
    amp = "bf16" if on_cuda else "off"
    dtype = torch.bfloat16 if on_cuda else torch.float32
    peak = measure_matmul_peak(device, dtype, n=256 if tiny else 8192, iters=3 if tiny else 10)
    steps = 6 if tiny else 100
    # Quoted: YAML reads a bare `off` as the boolean false.
    extra = [f"ddp.device={device.type}", f"train.amp='{amp}'"]
    try:
        times, _ = run_kubeddp(work, f"gpu-{device.type}", 1, model, steps, extra, timeout)
    except BenchError as exc:
        return [not_measured("gpu", "charlm model FLOPs utilisation", f"failed: {exc}")]
    tokens_per_s = times.samples_per_second() * model.seq_len
    flops_per_token = charlm_train_flops_per_token(
        model.n_layer, model.n_embd, model.seq_len, VOCAB_SIZE
    )
    card = torch.cuda.get_device_name(device) if on_cuda else "CPU"
    return [
        Row(
            "gpu",
            f"charlm model FLOPs utilisation ({amp}, {'NCCL' if on_cuda else 'gloo'}, world 1)",
            flops_per_token * tokens_per_s / peak,
            f"measured {dtype} matmul peak on {card}",
            f"{tokens_per_s:,.0f} tok/s; peak {peak / 1e12:.2f} TFLOP/s",
            "",
            f"{model.describe()}; {flops_per_token / 1e6:.1f} MFLOP/token",
        )
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="kubeddp GPU throughput and MFU")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="tiny model and matmul (smoke test)")
    p.add_argument("--out", default="", help="write the rows as JSON here")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu bench skipped: {NO_CUDA}")
        return 0
    with tempfile.TemporaryDirectory(prefix="kubeddp-bench-gpu-") as work:
        rows = bench_gpu(Path(work), args.device, args.tiny)
    for row in rows:
        ratio = "not measured" if row.ratio is None else f"{row.ratio:.3f}"
        print(f"{row.name}: {ratio} of {row.against} | {row.absolute} | {row.note}")
    if args.out:
        Path(args.out).write_text(json.dumps([r.to_dict() for r in rows], indent=2))
    return 0 if all(r.ratio is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
