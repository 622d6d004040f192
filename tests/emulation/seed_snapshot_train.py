"""A training script the way the DDP tutorials teach it (torchrun, snapshot fault tolerance):
rank 0 saves `snapshot.pt`, a relative path, every few epochs; at start every rank loads it if
it is there and goes on from the epoch it holds. It knows nothing of kubeddp or Kubernetes.

    torchrun --nproc-per-node 2 seed_snapshot_train.py 8 1

The tests run it in emulated pods whose checkpoint storage is a ReadWriteOnce claim: the
snapshot must survive the loss of the pod that wrote it.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomRows(Dataset):
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.rows = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator))
                     for _ in range(size)]  # fmt: skip

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        return self.rows[index]


def ddp_setup() -> None:
    dist.init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every: int, snapshot_path: str) -> None:
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print(f"[rank {self.rank}] loading snapshot {snapshot_path}", flush=True)
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path: str) -> None:
        snapshot = torch.load(snapshot_path, weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"[rank {self.rank}] Resuming training from snapshot at Epoch {self.epochs_run}",
              flush=True)  # fmt: skip

    def _run_batch(self, source, targets) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int, pause: float) -> None:
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)
        time.sleep(pause)  # stands for a longer epoch, so a test can stop a pod mid-training
        print(f"[rank {self.rank}] Epoch {epoch} done", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs: int, pause: float) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch, pause)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main(total_epochs: int, save_every: int, pause: float) -> None:
    ddp_setup()
    train_set = RandomRows(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    train_data = DataLoader(train_set, batch_size=32, sampler=DistributedSampler(train_set))
    trainer = Trainer(model, train_data, optimizer, save_every, "snapshot.pt")
    trainer.train(total_epochs, pause)
    if trainer.rank == 0:
        print(f"finished {total_epochs} epochs", flush=True)
    del trainer, model, optimizer  # no DDP reference may outlive the process group
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds added to each epoch")
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.pause)
