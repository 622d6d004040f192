"""Sum a value over every GPU worker: NCCL, a shared-file rendezvous."""

import datetime
import os

import torch
import torch.distributed as dist


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "nccl",
        init_method="file:///mnt/shared/ddp_init",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(minutes=5),
    )
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    ready = torch.ones(1, device="cuda")
    dist.all_reduce(ready)
    moved = torch.zeros(2)
    moved = moved.cuda()
    dist.broadcast(moved, src=0)
    if rank == 0:
        print(f"sum of ranks: {value.item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
