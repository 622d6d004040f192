"""The stop vote through a real one-rank gloo group: every vote is acted on exactly
VOTE_LAG_STEPS steps after it is cast (the same step on every rank, since every rank votes
every step), and draining returns what is still in flight. Several ranks stopping together
after SIGTERM is tests/integration/test_preemption.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from kubeddp.trainer.worker.distributed import DistContext
from kubeddp.trainer.worker.preemption import (
    STOP_NONE,
    STOP_PREEMPT,
    STOP_SAVE_FAILED,
    VOTE_LAG_STEPS,
    StopVote,
)
from tests.helpers.one_rank import DEVICE_TYPES, one_rank_group

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=DEVICE_TYPES)
def ctx(request: pytest.FixtureRequest) -> Iterator[DistContext]:
    with one_rank_group(request.param) as context:
        yield context


def test_a_vote_is_acted_on_a_fixed_number_of_steps_later(ctx: DistContext) -> None:
    vote = StopVote(ctx.device, distributed=True, grace_seconds=60)
    cast = [STOP_NONE, STOP_NONE, STOP_SAVE_FAILED, STOP_NONE, STOP_NONE, STOP_NONE, STOP_NONE]
    saves = [False, True, False, False, True, False, False]
    seen = [vote.vote(reason, save) for reason, save in zip(cast, saves, strict=True)]
    lag = len(cast) - VOTE_LAG_STEPS
    expected = list(zip([STOP_NONE] * VOTE_LAG_STEPS + cast[:lag],
                        [False] * VOTE_LAG_STEPS + saves[:lag], strict=True))  # fmt: skip
    assert seen == expected
    assert VOTE_LAG_STEPS == 2, "the docs promise a stop within two steps"


def test_sigterm_wins_and_drain_returns_the_votes_in_flight(ctx: DistContext) -> None:
    vote = StopVote(ctx.device, distributed=True, grace_seconds=60)
    assert vote.vote(STOP_NONE) == (STOP_NONE, False)
    vote.sigterm = True  # what the handler sets (without starting its exit timer)
    assert vote.vote(STOP_SAVE_FAILED) == (STOP_NONE, False)
    assert vote.drain() == STOP_PREEMPT
    assert vote.drain() == STOP_NONE, "nothing left in flight"


def test_the_ballots_are_reused(ctx: DistContext) -> None:
    vote = StopVote(ctx.device, distributed=True, grace_seconds=60)
    for _ in range(10):
        vote.vote(STOP_NONE)
    flags = {id(ballot.flag) for ballot in vote._ring}
    assert len(flags) == VOTE_LAG_STEPS + 1
    if ctx.device.type == "cuda":  # results come back through pinned host memory
        assert all(ballot.host.is_pinned() for ballot in vote._ring)


def test_alone_the_vote_is_immediate() -> None:
    vote = StopVote(torch.device("cpu"), distributed=False, grace_seconds=60)
    assert vote.vote(STOP_SAVE_FAILED, True) == (STOP_SAVE_FAILED, True)
    assert vote.drain() == STOP_NONE
