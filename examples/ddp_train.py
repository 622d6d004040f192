"""Train a small regression model with DistributedDataParallel: a torchrun-style script.

Runs unchanged under a plain torchrun and under kubeddp, which adds the rendezvous of every
launcher, preemption handling and per-pod Prometheus metrics:

    torchrun --nproc-per-node 2 examples/ddp_train.py --epochs 3
    kubeddp train --nproc 2 --script examples/ddp_train.py -- --epochs 3

It resumes from its snapshot (model, optimizer, position in the data) when one exists, so a
preempted run goes on where it stopped.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:  # optional: metrics and preemption when kubeddp runs this script
    from kubeddp import api as kubeddp_api
except ImportError:
    kubeddp_api = None

EXIT_PREEMPTED = kubeddp_api.EXIT_PREEMPTED if kubeddp_api else 143
INIT_TIMEOUT = datetime.timedelta(minutes=5)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="DDP regression example")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="samples per process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=1024, help="rows in the data set")
    parser.add_argument("--snapshot", default="snapshot.pt", help="where the snapshot lives")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to wait after a step")
    return parser.parse_args()


def ddp_setup() -> torch.device:
    """Join the process group that torchrun (or kubeddp) described in the environment; a peer
    that never answers fails a collective after INIT_TIMEOUT, not the backend's 10-30 min."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", timeout=INIT_TIMEOUT)
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo", timeout=INIT_TIMEOUT)
    return torch.device("cpu")


def make_dataset(rows: int) -> Dataset:
    """The same rows on every rank: a fixed generator, not the global random state."""
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(rows, 8, generator=gen)
    targets = inputs @ torch.randn(8, 1, generator=gen) + 0.1 * torch.randn(rows, 1, generator=gen)
    return TensorDataset(inputs, targets)


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def stop_requested() -> bool:
    return kubeddp_api.stop_requested() if kubeddp_api else False


class Trainer:
    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.rank = dist.get_rank()
        self.device = device
        self.snapshot_path = args.snapshot
        self.pause = args.pause
        data = make_dataset(args.samples)
        self.sampler = DistributedSampler(data, shuffle=True, seed=0)
        self.loader = DataLoader(data, batch_size=args.batch_size, sampler=self.sampler)
        self.epochs = args.epochs
        self.total_steps = len(self.loader) * args.epochs
        model = make_model().to(device)
        self.model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.epoch, self.batches_done, self.step = 0, 0, 0
        if os.path.exists(self.snapshot_path):
            self._load_snapshot()

    def _load_snapshot(self) -> None:
        snapshot = torch.load(self.snapshot_path, map_location=self.device, weights_only=True)
        self.model.module.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.epoch, self.batches_done = snapshot["epoch"], snapshot["batches_done"]
        self.step = snapshot["step"]
        if self.rank == 0:
            print(f"resuming from step {self.step} (epoch {self.epoch})", flush=True)

    def _save_snapshot(self) -> None:
        """Rank 0 writes a temporary file and renames it: a crash never leaves half a file."""
        if self.rank != 0:
            return
        snapshot = {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "step": self.step,
        }
        folder = os.path.dirname(os.path.abspath(self.snapshot_path))
        os.makedirs(folder, exist_ok=True)
        partial = f"{self.snapshot_path}.partial"
        torch.save(snapshot, partial)
        os.replace(partial, self.snapshot_path)
        print(f"saved snapshot at step {self.step}", flush=True)

    def _stop_everywhere(self) -> bool:
        """Every rank stops at the same step, or the others would wait for it forever."""
        flag = torch.tensor([int(stop_requested())], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _run_epoch(self) -> None:
        self.sampler.set_epoch(self.epoch)  # a different shuffle each epoch, the same on all
        for index, (inputs, targets) in enumerate(self.loader):
            if index < self.batches_done:  # trained before the snapshot
                continue
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            self.optimizer.zero_grad()
            loss = nn.functional.mse_loss(self.model(inputs), targets)
            loss.backward()
            self.optimizer.step()
            self.step += 1
            self.batches_done = index + 1
            if kubeddp_api:
                kubeddp_api.report_step(
                    self.step, samples=len(inputs), loss=loss, total_steps=self.total_steps,
                    epoch=self.epoch, total_epochs=self.epochs,
                )  # fmt: skip
            if self.pause:
                time.sleep(self.pause)
            if self._stop_everywhere():
                self._save_snapshot()
                sys.exit(EXIT_PREEMPTED)
        if self.rank == 0:
            print(f"epoch {self.epoch} done: step {self.step}", flush=True)
        self.epoch, self.batches_done = self.epoch + 1, 0

    def train(self, epochs: int) -> None:
        while self.epoch < epochs:
            self._run_epoch()
            self._save_snapshot()

    def parameters_digest(self) -> str:
        digest = hashlib.sha256()
        for tensor in self.model.module.state_dict().values():
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()[:16]


def main() -> None:
    args = parse_args()
    device = ddp_setup()
    trainer = Trainer(args, device)
    trainer.train(args.epochs)
    if trainer.rank == 0:
        print(f"done: {trainer.step} steps, parameters sha256 {trainer.parameters_digest()}")
    del trainer  # no DDP module may outlive the process group (torch may abort otherwise)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
