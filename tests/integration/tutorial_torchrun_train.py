"""A training script in the style the torchrun tutorials teach (positional `total_epochs
save_every`, LOCAL_RANK/RANK/WORLD_SIZE from the launcher, gloo, DistributedSampler with
set_epoch), run by tests/integration/test_torchrun_command_lines.py under `kubeddp train`."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", type=int, default=8)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun's env: MASTER_ADDR, RANK, WORLD_SIZE ...
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for epoch in range(args.total_epochs):
        sampler.set_epoch(epoch)
        for features, target in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(features), target).backward()
            optimizer.step()
            steps += 1
    weight = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(weight) for _ in range(world)]
    dist.all_gather(gathered, weight)  # DDP keeps every replica equal
    same = all(torch.equal(gathered[0], other) for other in gathered)
    print(f"tutorial rank {rank}/{world} local {local_rank} steps {steps} same {same}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
