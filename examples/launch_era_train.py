"""A script from the `torch.distributed.launch` era: it takes its local rank from `--local_rank`
(torch 1.x's launcher) or `--local-rank` (torch 2.x's) instead of the LOCAL_RANK environment
variable. kubeddp runs it unchanged; torchrun's `${local_rank}` macro in its arguments becomes
each worker's local rank (single quotes keep a shell from emptying it):

    kubeddp train --nproc 2 --script examples/launch_era_train.py -- '--local_rank=${local_rank}'
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", "--local-rank", type=int, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--note", default="", help="any text, printed back")
    args, unknown = parser.parse_known_args()

    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)
        device, backend = torch.device("cuda", args.local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(minutes=5))

    torch.manual_seed(0)
    model = DDP(
        nn.Linear(4, 1).to(device), device_ids=[args.local_rank] if backend == "nccl" else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        batch = torch.randn(8, 4, device=device)
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()
    seen = {
        "rank": dist.get_rank(),
        "local_rank": args.local_rank,
        "note": args.note,
        "unknown": unknown,
        "steps": args.steps,
    }
    print("launch-era worker: " + json.dumps(seen), flush=True)
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
