"""Gradient accumulation with no_sync, AMP, clipping, a barrier and all_gather_object (the
all-reduce tutorial's style), for torchrun."""

import contextlib
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ACCUMULATION_STEPS = 4


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    dataset = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
    sampler = DistributedSampler(dataset, shuffle=True, seed=42)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, pin_memory=use_cuda)
    model = DDP(torch.nn.Linear(32, 4).to(device), device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(enabled=use_cuda)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            last = (step + 1) % ACCUMULATION_STEPS == 0
            with contextlib.nullcontext() if last else model.no_sync():
                with torch.autocast(device.type, enabled=use_cuda):
                    loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUMULATION_STEPS
                scaler.scale(loss).backward()
            if last:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.tensor([loss.item()], device=device)
    dist.all_reduce(loss_sum)
    dist.barrier()
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, {"rank": dist.get_rank(), "loss": loss_sum.item()})
    if dist.get_rank() == 0:
        print(results)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
