"""DDP for `python -m torch.distributed.launch --nproc_per_node 2 launch_era.py` (the launch
utility passes --local_rank to every process)."""

import argparse
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int)  # pitfall(no-args): local-rank-arg
parser.add_argument("--epochs", type=int, default=5)
args = parser.parse_args()

torch.cuda.set_device(args.local_rank)
dist.init_process_group(
    backend="nccl", init_method="env://", timeout=datetime.timedelta(minutes=10)
)
rank = dist.get_rank()

inputs = torch.randn(1024, 10)
dataset = TensorDataset(inputs, (inputs.sum(dim=1) > 0).float())
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=64, sampler=sampler)
model = DDP(torch.nn.Linear(10, 1).cuda(), device_ids=[args.local_rank])
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = torch.nn.BCEWithLogitsLoss()

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for data, label in loader:
        data, label = data.cuda(), label.cuda()
        optimizer.zero_grad()
        loss_fn(model(data).squeeze(1), label).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.module.state_dict(), f"/checkpoints/epoch{epoch}.ckpt")
dist.destroy_process_group()
