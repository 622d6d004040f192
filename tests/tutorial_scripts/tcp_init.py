"""A torchrun-era script that meets at a fixed tcp:// address, as the init-methods tutorial
teaches (`tcp://10.1.1.20:23456`, "the address of one of the machines": on one machine, its
loopback). Its rank 0 serves that store itself."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        backend="gloo", init_method="tcp://127.0.0.1:23456", rank=rank, world_size=world_size
    )
    return rank


def main():
    rank = setup()
    inputs = torch.randn(256, 4)
    dataset = TensorDataset(inputs, inputs.mean(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    if rank == 0:
        print("finished")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
