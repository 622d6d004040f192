"""gloo communication measurements, run under torchrun by bench_comm.py (rank 0 writes JSON).

1. all_reduce bus bandwidth per message size, and a same-size memory copy on every rank at
   the same moment (the copy is what moving those bytes costs without any transport).
2. A DDP step's exposed communication: (fwd+bwd with gradient sync) - (fwd+bwd under
   no_sync), next to one raw all_reduce of a flat buffer holding every gradient.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from kubeddp.trainer.workloads.charlm import VOCAB_SIZE, CharGPT

BYTES_PER_FLOAT = 4


def median_seconds(fn: Callable[[], object], iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        dist.barrier()  # both ranks start together, so the time is the collective's own
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bandwidth(sizes_mb: list[float], iters: int) -> list[dict]:
    world = dist.get_world_size()
    results = []
    for size_mb in sizes_mb:
        numel = int(size_mb * 2**20) // BYTES_PER_FLOAT
        nbytes = numel * BYTES_PER_FLOAT
        buf = torch.ones(numel)
        src, dst = torch.ones(numel), torch.empty(numel)
        reduce_s = median_seconds(lambda b=buf: dist.all_reduce(b), iters)
        copy_s = median_seconds(lambda s=src, d=dst: d.copy_(s), iters)
        algbw = nbytes / reduce_s
        results.append(
            {
                "size_mb": size_mb,
                "all_reduce_s": reduce_s,
                # Bus bandwidth: what each link carried in a ring all_reduce, 2(n-1)/n x data.
                "bus_bytes_per_s": algbw * 2 * (world - 1) / world,
                "copy_bytes_per_s": nbytes / copy_s,
            }
        )
    return results


def exposed_comm(args: argparse.Namespace, steps: int) -> dict:
    torch.manual_seed(0)
    model = CharGPT(VOCAB_SIZE, args.seq_len, args.n_layer, args.n_head, args.n_embd, 0.0)
    ddp = DDP(model)
    tokens = torch.randint(0, VOCAB_SIZE, (args.batch_size, args.seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def fwd_bwd() -> None:
        logits = ddp(inputs)
        F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), targets.reshape(-1)).backward()
        ddp.zero_grad(set_to_none=True)

    def no_sync_step() -> None:
        with ddp.no_sync():
            fwd_bwd()

    synced, local = [], []
    for _ in range(3):  # interleave blocks so drifts in machine load hit both
        synced.append(median_seconds(fwd_bwd, steps))
        local.append(median_seconds(no_sync_step, steps))
    grad_numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    flat = torch.zeros(grad_numel)
    raw = median_seconds(lambda: dist.all_reduce(flat), steps)
    step_s, compute_s = statistics.median(synced), statistics.median(local)
    return {
        "step_s": step_s,
        "compute_only_s": compute_s,
        "exposed_s": step_s - compute_s,
        "raw_all_reduce_s": raw,
        "grad_bytes": grad_numel * BYTES_PER_FLOAT,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sizes-mb", default="1,16,64")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--n-layer", type=int, default=3)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=192)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    dist.init_process_group("gloo")
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    result = {
        "world_size": dist.get_world_size(),
        "bandwidth": bandwidth(sizes, args.iters),
        "ddp": exposed_comm(args, args.steps),
    }
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(result))
    gc.collect()  # the DDP module from exposed_comm must be gone before the group is destroyed
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
