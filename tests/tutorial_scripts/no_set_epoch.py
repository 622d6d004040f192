"""env:// DDP with a DistributedSampler that is never told the epoch; resumes from a file."""

import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CKPT = "/checkpoints/model.pt"


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend="nccl", init_method="env://", timeout=datetime.timedelta(minutes=10)
    )
    model = torch.nn.Linear(16, 4).cuda()
    if os.path.exists(CKPT):
        model.load_state_dict(torch.load(CKPT))  # pitfall: load-no-map-location
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    features = torch.randn(4096, 16)
    dataset = TensorDataset(features, features[:, :4])
    sampler = DistributedSampler(dataset)  # pitfall: no-set-epoch
    loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=2)
    optimizer = torch.optim.AdamW(model.parameters())
    for _epoch in range(10):
        for x, y in loader:
            x, y = x.cuda(local_rank), y.cuda(local_rank)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), CKPT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
