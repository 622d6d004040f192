"""DDP for `python -m torch.distributed.launch --nproc_per_node 2 launch_era.py` (the launch
utility passes --local_rank to every process; under kubeddp: `kubeddp train --nproc_per_node 2
launch_era.py '--local_rank=${local_rank}'`). NCCL on GPUs, gloo on CPU."""

import argparse
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int)
parser.add_argument("--epochs", type=int, default=5)
args = parser.parse_args()

use_cuda = torch.cuda.is_available()
if use_cuda:
    torch.cuda.set_device(args.local_rank)
device = torch.device("cuda", args.local_rank) if use_cuda else torch.device("cpu")
dist.init_process_group(
    backend="nccl" if use_cuda else "gloo",
    init_method="env://",
    timeout=datetime.timedelta(minutes=10),
)
rank = dist.get_rank()

inputs = torch.randn(1024, 10)
dataset = TensorDataset(inputs, (inputs.sum(dim=1) > 0).float())
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=64, sampler=sampler)
model = DDP(torch.nn.Linear(10, 1).to(device), device_ids=[args.local_rank] if use_cuda else None)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = torch.nn.BCEWithLogitsLoss()

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for data, label in loader:
        data, label = data.to(device), label.to(device)
        optimizer.zero_grad()
        loss_fn(model(data).squeeze(1), label).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.module.state_dict(), f"{epoch}.ckpt")
if rank == 0:
    print(f"done: {args.epochs} epochs on {dist.get_world_size()} workers", flush=True)
dist.destroy_process_group()
