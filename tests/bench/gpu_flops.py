"""What the GPU bench scores against: charlm's training FLOPs per token and the card's
measured matmul peak (model FLOPs utilisation = FLOPs per token x tokens/s / peak)."""

from __future__ import annotations

import time

import torch


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
    del a, b, out
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the memory back before the training runs start
    return 2.0 * n**3 / best
