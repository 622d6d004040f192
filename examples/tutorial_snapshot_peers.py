"""The DDP tutorial series' fault-tolerant torchrun script, adapted in a few lines so a lost pod
resumes from a peer's memory at the step it was lost, not from the last epoch's snapshot.pt.

    torchrun --standalone --nproc-per-node 2 tutorial_snapshot_peers.py 50 10
    kubeddp train --nproc 2 --script examples/tutorial_snapshot_peers.py -- 50 10

The lines marked `# kubeddp` are the whole change (docs/your-own-script.md); without kubeddp
(a plain torchrun) they do nothing and the script is the tutorial's, but for its snapshot.pt,
written under another name and renamed (as `kubeddp check` advises).
"""

import argparse
import datetime
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:  # kubeddp
    from kubeddp import api as kubeddp_api  # kubeddp
except ImportError:  # kubeddp
    kubeddp_api = None  # kubeddp

SNAPSHOT_PATH = "snapshot.pt"


def ddp_setup():
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    init_process_group(backend=backend, timeout=datetime.timedelta(minutes=10))
    return local_rank


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.batches_done = 0  # kubeddp: the position in the epoch
        self.snapshot_path = snapshot_path
        restored = None  # kubeddp
        if kubeddp_api:  # kubeddp: the newest state any rank holds, or None
            restored = kubeddp_api.register_state(model=model, optimizer=optimizer, progress=self)
        if restored is None and os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def state_dict(self):  # kubeddp: the trainer's own progress is part of the state
        return {"epochs_run": self.epochs_run, "batches_done": self.batches_done}

    def load_state_dict(self, state):  # kubeddp
        self.epochs_run, self.batches_done = state["epochs_run"], state["batches_done"]

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, f"{self.snapshot_path}.partial")  # a kill never leaves half a file
        os.replace(f"{self.snapshot_path}.partial", self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self.train_data.sampler.set_epoch(epoch)
            for index, (source, targets) in enumerate(self.train_data):
                if index < self.batches_done:  # kubeddp: trained before the snapshot
                    continue  # kubeddp
                self.optimizer.zero_grad()
                F.mse_loss(self.model(source), targets).backward()
                self.optimizer.step()
                self.batches_done = index + 1  # kubeddp
                if kubeddp_api:  # kubeddp: once per step; takes the snapshots
                    step = epoch * len(self.train_data) + index + 1  # kubeddp
                    kubeddp_api.report_step(step, samples=len(source))  # kubeddp
            self.epochs_run, self.batches_done = epoch + 1, 0  # kubeddp
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main(total_epochs, save_every, batch_size):
    ddp_setup()
    torch.manual_seed(0)
    inputs = torch.randn(512, 20)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    loader = DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset))
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    trainer = Trainer(model, loader, optimizer, save_every, SNAPSHOT_PATH)
    trainer.train(total_epochs)
    if trainer.global_rank == 0:
        weights = trainer.model.module.weight.detach().flatten().tolist()
        print("final weights " + " ".join(f"{w:.8e}" for w in weights), flush=True)
    del trainer
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.batch_size)
