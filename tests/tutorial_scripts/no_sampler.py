"""DP turned DDP in a hurry: the DataLoader still shuffles the whole data set on every rank."""

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


class SimpleModel(nn.Module):
    def __init__(self, n_dim):
        super().__init__()
        self.fc = nn.Linear(n_dim, 1)

    def forward(self, x):
        return torch.sigmoid(self.fc(x))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=2))
    data = torch.randn(2048, 8)
    dataset = TensorDataset(data, (data[:, 0] > 0).float().unsqueeze(1))
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    model = DDP(SimpleModel(8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_func = nn.BCELoss()
    for epoch in range(4):
        for x, y in loader:
            optimizer.zero_grad()
            loss_func(model(x), y).backward()
            optimizer.step()
        state = model.module.state_dict()
        torch.save(state, f"e{epoch}.pt")
    print(f"worker {local_rank} done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
