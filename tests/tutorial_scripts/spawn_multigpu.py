"""Single-node multi-worker DDP started with mp.spawn (the tutorial series' multigpu.py style).

    python spawn_multigpu.py 6 2 --world-size 2 --snapshot /checkpoints/snapshot.pt

Every `save_every` epochs rank 0 writes a snapshot (model, optimizer, epochs run); a rerun
resumes from it. gloo on CPU, NCCL on GPUs.
"""

import argparse
import datetime
import os
import time

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup(rank: int, world_size: int) -> torch.device:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    init_process_group(
        backend=backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(minutes=5)
    )
    if backend == "nccl":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


class Trainer:
    def __init__(
        self, model, train_data, optimizer, device, rank, save_every, snapshot_path, pause
    ):
        self.rank = rank
        self.device = device
        self.model = model.to(device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.pause = pause
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(
            f"[GPU{self.rank}] Resuming training from snapshot at Epoch {self.epochs_run}",
            flush=True,
        )

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        time.sleep(self.pause)

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source.to(self.device), targets.to(self.device))
        print(f"[GPU{self.rank}] Epoch {epoch} | Steps: {len(self.train_data)}", flush=True)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch + 1,
        }
        partial = self.snapshot_path + ".partial"  # renamed when whole: never half a file
        torch.save(snapshot, partial)
        os.replace(partial, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 20, generator=gen)
    train_set = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def main(rank, world_size, total_epochs, save_every, batch_size, snapshot_path, pause):
    device = ddp_setup(rank, world_size)
    dataset, model, optimizer = load_train_objs()
    train_data = DataLoader(
        dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset)
    )
    trainer = Trainer(model, train_data, optimizer, device, rank, save_every, snapshot_path, pause)
    trainer.train(total_epochs)
    if rank == 0:
        print(f"done: {total_epochs} epochs on {world_size} workers", flush=True)
    del trainer
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size per worker")
    parser.add_argument("--world-size", type=int, default=torch.cuda.device_count() or 2)
    parser.add_argument("--snapshot", default="/checkpoints/snapshot.pt")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds after each batch")
    args = parser.parse_args()
    mp.spawn(
        main,
        args=(
            args.world_size,
            args.total_epochs,
            args.save_every,
            args.batch_size,
            args.snapshot,
            args.pause,
        ),
        nprocs=args.world_size,
    )
