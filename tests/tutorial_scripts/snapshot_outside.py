"""torchrun snapshots, but to /tmp, with the port it used to pass on the command line."""

import datetime
import os

import torch
from torch.distributed import destroy_process_group, get_rank, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    os.environ["MASTER_PORT"] = "29500"
    init_process_group(backend="gloo", timeout=datetime.timedelta(minutes=10))
    inputs = torch.randn(300, 6)
    dataset = TensorDataset(inputs, inputs.sum(1, keepdim=True))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=10, sampler=sampler)
    model = DDP(torch.nn.Linear(6, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(5):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        if get_rank() == 0:
            snapshot = {"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
            torch.save(snapshot, "/tmp/snapshot.pt")
    if get_rank() == 0:
        print("done: 5 epochs", flush=True)
    destroy_process_group()


if __name__ == "__main__":
    main()
