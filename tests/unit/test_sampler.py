"""ResumableDistributedSampler: torch's order from the start, and exactly-once training of an
epoch however often it is interrupted and whatever world size each part runs at."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from torch.utils.data import DistributedSampler

from kubeddp.trainer.worker.sampler import ResumableDistributedSampler

pytestmark = pytest.mark.timeout(60)


class _Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("n,world", [(10, 1), (10, 2), (11, 2), (100, 3), (7, 8)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_fresh_epoch_matches_torch_distributed_sampler(n: int, world: int, shuffle: bool) -> None:
    for epoch in (0, 3):
        for rank in range(world):
            ours = ResumableDistributedSampler(n, world, rank, seed=7, shuffle=shuffle)
            ours.set_epoch(epoch)
            torch_own = DistributedSampler(
                _Sized(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=7
            )
            torch_own.set_epoch(epoch)
            assert list(ours) == list(torch_own)
            assert len(ours) == len(torch_own)


def _train_segment(n: int, world: int, epoch: int, consumed: int, steps: int, batch: int):
    """What `world` ranks train in `steps` steps from `consumed`; returns ids and new position."""
    per_rank = [_ids(n, world, r, epoch, consumed) for r in range(world)]
    taken = [ids[: steps * batch] for ids in per_rank]
    trained = [i for ids in taken for i in ids]
    return trained, consumed + len(taken[0]) * world


def _ids(n: int, world: int, rank: int, epoch: int, consumed: int) -> list[int]:
    sampler = ResumableDistributedSampler(n, world, rank, seed=3)
    sampler.set_epoch(epoch, consumed)
    return list(sampler)


@pytest.mark.parametrize("trial", range(40))
def test_interrupted_epoch_trains_each_sample_once_across_world_sizes(trial: int) -> None:
    rng = random.Random(trial)
    batch = rng.choice([1, 2, 4])
    worlds = [rng.choice([1, 2, 4]) for _ in range(rng.randint(2, 5))]
    n = 8 * batch * rng.randint(3, 12)
    consumed, seen = 0, Counter()
    for world in worlds[:-1]:
        left_per_rank = (n - consumed) // world
        steps = rng.randint(0, max(0, left_per_rank // batch - 1))
        trained, consumed = _train_segment(n, world, 1, consumed, steps, batch)
        seen.update(trained)
    last = worlds[-1]
    padding = -(n - consumed) % last  # a last world that does not divide the rest pads
    trained, consumed = _train_segment(n, last, 1, consumed, n, batch)  # to the end
    seen.update(trained)
    assert consumed == n + padding
    assert sorted(seen) == list(range(n)), (worlds, batch)
    assert sum(seen.values()) == n + padding, (worlds, batch)


def test_padding_only_repeats_samples_to_even_out_the_last_step() -> None:
    n, world = 10, 4
    trained = [i for r in range(world) for i in _ids(n, world, r, 0, 3)]
    counts = Counter(trained)
    assert set(range(n)) - set(counts) == set(_ids_order(n)[:3])
    assert len(trained) == 8 and sum(c - 1 for c in counts.values()) == 1


def _ids_order(n: int) -> list[int]:
    return ResumableDistributedSampler(n, 1, 0, seed=3).epoch_order()


def test_position_past_the_end_yields_nothing() -> None:
    sampler = ResumableDistributedSampler(10, 2, 1, seed=3)
    sampler.set_epoch(0, 10)
    assert len(sampler) == 0 and list(sampler) == []


def test_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 outside 0..1"):
        ResumableDistributedSampler(10, 2, 2, seed=0)
