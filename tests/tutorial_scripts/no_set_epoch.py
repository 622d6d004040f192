"""env:// DDP with a DistributedSampler that is never told the epoch; resumes from a file.
NCCL on GPUs, gloo on CPU."""

import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CKPT = "model.pt"


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        init_method="env://",
        timeout=datetime.timedelta(minutes=10),
    )
    model = torch.nn.Linear(16, 4).to(device)
    if os.path.exists(CKPT):
        model.load_state_dict(torch.load(CKPT))
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    features = torch.randn(4096, 16)
    dataset = TensorDataset(features, features[:, :4])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=2)
    optimizer = torch.optim.AdamW(model.parameters())
    for _epoch in range(10):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), CKPT)
    if dist.get_rank() == 0:
        print(f"done: 10 epochs, saved {CKPT}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
