"""A DistributedSampler that can start mid-epoch, also after the world size changed.

torch's DistributedSampler gives rank r the indices perm[r::W]. After k samples per rank the
ranks together consumed exactly perm[:k*W], so the position inside an epoch is one number,
`consumed` (global samples), valid for any later world size: a resumed rank r takes
perm[consumed:][r::W'] — every sample of the epoch is trained once, none twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ResumableDistributedSampler(Sampler[int]):
    def __init__(
        self, dataset_len: int, num_replicas: int, rank: int, seed: int, shuffle: bool = True
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside 0..{num_replicas - 1}")
        self.dataset_len = dataset_len
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.consumed = 0  # global samples of this epoch already trained

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        self.epoch = epoch
        self.consumed = consumed

    def state_dict(self) -> dict[str, int | bool]:
        """What the epoch order depends on besides seed and epoch (the checkpoint's part
        `sampler`; the position itself is the trainer's `consumed`)."""
        return {"dataset_len": self.dataset_len, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, int | bool]) -> None:
        # Another dataset size is another order: the saved position would skip or repeat
        # samples, so resuming is refused instead.
        if state["dataset_len"] != self.dataset_len or state["shuffle"] != self.shuffle:
            raise ValueError(
                f"it was written for {state['dataset_len']} training samples, this run has "
                f"{self.dataset_len}: its position in the epoch would skip or repeat samples"
            )

    def epoch_order(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(self.dataset_len, generator=g).tolist()
        return list(range(self.dataset_len))

    def __len__(self) -> int:
        remaining = max(0, self.dataset_len - self.consumed)
        return math.ceil(remaining / self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        remaining = self.epoch_order()[self.consumed :]
        per_rank = len(self)
        total = per_rank * self.num_replicas
        while remaining and len(remaining) < total:
            # Pad like DistributedSampler so every rank runs the same number of steps.
            remaining += remaining[: total - len(remaining)]
        return iter(remaining[self.rank : total : self.num_replicas])
