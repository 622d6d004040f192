"""A user's own DDP script (gloo) with one fault on one rank, for the diagnostics tests.

    python fault_script.py --fault sleep_data|skip_allreduce|deadlock|nan|none --rank R
        --step K [--report] [--steps N]

Every step: a batch from a DataLoader, forward, backward (DDP), an optimizer step, then one
all_reduce of the loss on a group of its own (as a logging helper would do, to log a mean);
with --report, kubeddp.api.report_step.
The faults are those of tests/helpers/faults.py; `skip_allreduce`: the rank leaves out that
step's all_reduce, runs ahead, and after the loop waits in a barrier that the others, one
all_reduce behind, never reach.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from tests.helpers.faults import deadlock, sleep_in_data_loader

try:
    from kubeddp import api as kubeddp_api
except ImportError:
    kubeddp_api = None


class Rows(Dataset):
    def __init__(self, sleep_at: int | None) -> None:
        self.sleep_at = sleep_at

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.sleep_at is not None and index >= self.sleep_at:
            sleep_in_data_loader()
        return torch.full((4,), float(index % 7))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", default="none")
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--step", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    me = dist.get_rank() == args.rank
    batch = 8
    sleep_at = (args.step - 1) * batch if me and args.fault == "sleep_data" else None
    loader = iter(DataLoader(Rows(sleep_at), batch_size=batch))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    logging_group = dist.new_group(backend="gloo")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        x = next(loader)
        if me and step == args.step and args.fault == "deadlock":
            deadlock()
        loss = model(x).pow(2).mean()
        if me and step == args.step and args.fault == "nan":
            loss = loss * float("nan")
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        if not (me and step == args.step and args.fault == "skip_allreduce"):
            dist.all_reduce(mean, group=logging_group)
        if args.report and kubeddp_api is not None:
            kubeddp_api.report_step(step, batch, loss=loss.item())
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"done: {args.steps} steps on {os.environ.get('WORLD_SIZE')} ranks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
