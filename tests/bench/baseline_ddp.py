"""The hand-written DDP loop kubeddp is measured against: the canonical torchrun tutorial loop.

DistributedSampler, DDP, AdamW and nothing else (no clipping, schedule, metrics, checkpoints,
logging). Same model and data as kubeddp's charlm workload. Run it with torchrun:

    torchrun --standalone --nproc-per-node 2 tests/bench/baseline_ddp.py --steps 100
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from kubeddp.trainer.config import WorkloadConfig
from kubeddp.trainer.workloads import charlm


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--corpus-max-bytes", type=int, default=2_000_000)
    p.add_argument("--summary-file", default="", help="rank 0 writes step end times here")
    return p.parse_args()


def train(
    cfg: WorkloadConfig, batch_size: int, lr: float, seed: int, steps: int
) -> tuple[list[float], list[float]]:
    """The tutorial loop for `steps` optimizer steps; returns each step's end as wall-clock
    time (time.time()) and as this process's CPU time (time.process_time(), all threads)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    workload = charlm.build(cfg, seed)
    model = DDP(workload.model)
    sampler = DistributedSampler(workload.train_set, num_replicas=world, rank=rank, seed=seed)
    loader = DataLoader(workload.train_set, batch_size=batch_size, sampler=sampler)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    step_end_unix: list[float] = []
    step_end_cpu: list[float] = []
    epoch = 0
    while len(step_end_unix) < steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = workload.loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            step_end_unix.append(time.time())
            step_end_cpu.append(time.process_time())
            if len(step_end_unix) == steps:
                break
        epoch += 1
    # Drop DDP and the optimizer before anyone destroys the group (see teardown() in
    # trainer/worker/distributed.py).
    del model, optimizer
    gc.collect()
    return step_end_unix, step_end_cpu


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    cfg = WorkloadConfig(
        name="charlm",
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        seq_len=args.seq_len,
        corpus_max_bytes=args.corpus_max_bytes,
    )
    step_end_unix, step_end_cpu = train(cfg, args.batch_size, args.lr, args.seed, args.steps)
    if dist.get_rank() == 0 and args.summary_file:
        summary = {
            "world_size": dist.get_world_size(),
            "samples_per_step": args.batch_size * dist.get_world_size(),
            "tokens_per_sample": args.seq_len,
            "step_end_unix": step_end_unix,
            "step_end_cpu": step_end_cpu,
        }
        Path(args.summary_file).write_text(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
