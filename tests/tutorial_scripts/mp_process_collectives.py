"""Point-to-point and all_reduce between processes started with mp.Process (the collectives
tutorial's style), gloo on one machine."""

import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)
    else:
        dist.recv(tensor=tensor, src=0)
    group = dist.new_group(list(range(size)))
    total = torch.ones(1) * rank
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    print(f"Rank {rank} has data {tensor[0]} and sum {total[0]}")


def init_process(rank, size, fn, backend="gloo"):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(
        backend, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=60)
    )
    fn(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = 2
    processes = []
    mp.set_start_method("spawn")
    for rank in range(world_size):
        p = mp.Process(target=init_process, args=(rank, world_size, run))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
