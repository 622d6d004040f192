"""The hand-written DDP loop kubeddp is measured against: the canonical torchrun tutorial loop.

DistributedSampler, DDP, AdamW and nothing else (no clipping, schedule, metrics, checkpoints).
Same model and data as kubeddp's charlm workload. On CUDA it is what a competent user writes
for speed: NCCL, pinned non-blocking copies, bf16 autocast, torch.compile before DDP, and the
loss read back (a host sync) only every `--sync-every` steps, as a loop that logs would. On CPU
it is the plain tutorial loop (gloo, fp32). AdamW runs the kernel kubeddp picks
(trainer/worker/schedule.py: fused, on CPU and CUDA), so a ratio against this loop measures the
loop and not the optimizer; `--adamw default` gives torch's default kernel (per tensor on CPU),
what the tutorial's `AdamW(params, lr)` gets. Run it with:

    torchrun --standalone --nproc-per-node 2 tests/bench/baseline_ddp.py --steps 100
    torchrun --standalone --nproc-per-node 1 tests/bench/baseline_ddp.py --steps 100 \
        --device cuda --amp bf16 --compile
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from kubeddp.trainer.config import WorkloadConfig
from kubeddp.trainer.workloads import charlm

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16}
# AdamW's kernel: "fused" is what kubeddp's schedule.adamw_kernel picks for parameters all on
# one CPU or CUDA device; "default" leaves it to torch (per-tensor loops on CPU, foreach on CUDA)
ADAMW_KERNELS = {"fused": {"fused": True}, "default": {}}


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
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--amp", choices=list(AMP_DTYPES), default="off", help="autocast dtype")
    p.add_argument("--compile", action="store_true", help="torch.compile the model, then DDP")
    p.add_argument("--sync-every", type=int, default=10, help="CUDA: read the loss every N")
    p.add_argument("--adamw", choices=list(ADAMW_KERNELS), default="fused", help="AdamW kernel")
    p.add_argument("--summary-file", default="", help="rank 0 writes step end times here")
    return p.parse_args()


def train(
    cfg: WorkloadConfig,
    batch_size: int,
    lr: float,
    seed: int,
    steps: int,
    device: torch.device | None = None,
    amp_dtype: torch.dtype | None = None,
    compile_model: bool = False,
    sync_every: int = 10,
    adamw: str = "fused",
) -> tuple[list[float], list[float]]:
    """The tutorial loop for `steps` optimizer steps; returns each step's end as wall-clock
    time (time.time()) and as this process's CPU time (time.process_time(), all threads).

    On CUDA the step ends are exact only where the loop synced (every `sync_every` steps);
    in between they mark when the host queued the step, so readers time windows between
    synced steps (tests/bench/gpu_runs.py does)."""
    device = device or torch.device("cpu")
    on_cuda = device.type == "cuda"
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    workload = charlm.build(cfg, seed)
    model = workload.model.to(device)
    if compile_model:
        model = torch.compile(model)
    model = DDP(model, device_ids=[device.index] if on_cuda else None)
    sampler = DistributedSampler(workload.train_set, num_replicas=world, rank=rank, seed=seed)
    loader = DataLoader(
        workload.train_set, batch_size=batch_size, sampler=sampler, pin_memory=on_cuda
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, **ADAMW_KERNELS[adamw])

    autocast = (
        torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    )
    step_end_unix: list[float] = []
    step_end_cpu: list[float] = []
    epoch = 0
    while len(step_end_unix) < steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            if on_cuda:
                batch = [t.to(device, non_blocking=True) for t in batch]
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = workload.loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            done = len(step_end_unix) + 1
            if on_cuda and (done % sync_every == 0 or done == steps):
                loss.item()  # what a loop that logs the loss does; makes this step end exact
            step_end_unix.append(time.time())
            step_end_cpu.append(time.process_time())
            if done == steps:
                break
        epoch += 1
    # Drop DDP and the optimizer before anyone destroys the group (see teardown() in
    # trainer/worker/distributed.py).
    del model, optimizer
    gc.collect()
    return step_end_unix, step_end_cpu


def main() -> None:
    args = parse_args()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    cfg = WorkloadConfig(
        name="charlm",
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        seq_len=args.seq_len,
        corpus_max_bytes=args.corpus_max_bytes,
    )
    step_end_unix, step_end_cpu = train(
        cfg,
        args.batch_size,
        args.lr,
        args.seed,
        args.steps,
        device,
        AMP_DTYPES[args.amp],
        args.compile,
        args.sync_every,
        args.adamw,
    )
    if dist.get_rank() == 0 and args.summary_file:
        summary = {
            "world_size": dist.get_world_size(),
            "samples_per_step": args.batch_size * dist.get_world_size(),
            "tokens_per_sample": args.seq_len,
            "step_end_unix": step_end_unix,
            "step_end_cpu": step_end_cpu,
            "sync_every": args.sync_every if device.type == "cuda" else 1,
        }
        if device.type == "cuda":
            summary["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
        Path(args.summary_file).write_text(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
