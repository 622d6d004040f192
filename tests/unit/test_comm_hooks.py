"""ddp.comm_hook in one process over a real gloo group: the hooks are PyTorch's own, run after
the straggler measurement's mark, and PowerSGD's state survives a new DDP module (new bucket
layout) bit for bit. The multi-process exact resume: tests/integration/test_comm_hook_resume.py."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from kubeddp.trainer.config import DDPConfig, config_from_dict
from kubeddp.trainer.worker import comm_hooks, grad_ready
from tests.helpers.one_rank import one_rank_group

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def group() -> Iterator[None]:
    with one_rank_group("cpu"):
        yield


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(24, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32), torch.nn.Linear(32, 4)
    )


def _step(ddp: DDP, seed: int) -> list[torch.Tensor]:
    """One forward/backward on a fixed batch; the gradients DDP left."""
    ddp.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(seed)
    ddp(torch.randn(16, 24, generator=gen)).pow(2).mean().backward()
    return [p.grad.clone() for p in ddp.parameters()]


def _cfg(**ddp: object) -> DDPConfig:
    return config_from_dict({"ddp": ddp}).ddp


def test_the_straggler_mark_runs_before_the_chosen_hook(group: None) -> None:
    calls: list[str] = []

    def inner(state, bucket):  # noqa: ANN001, ANN202
        calls.append("hook")
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp = DDP(_model())
    comm_hooks.register(ddp, comm_hooks.CommHook(inner), lambda: calls.append("ready"))
    _step(ddp, 0)
    assert (
        calls
        and calls[::2] == ["ready"] * (len(calls) // 2)
        and calls[1::2] == ["hook"] * (len(calls) // 2)
    )


def test_bf16_sends_bfloat16(group: None) -> None:
    plain, squeezed = DDP(_model()), DDP(_model())
    comm_hooks.register(squeezed, comm_hooks.build(_cfg(comm_hook="bf16"), [], 0), None)
    for got, full in zip(_step(squeezed, 1), _step(plain, 1), strict=True):
        assert torch.equal(got, full.to(torch.bfloat16).to(torch.float32))
    assert not all(
        torch.equal(a, b) for a, b in zip(_step(squeezed, 1), _step(plain, 1), strict=True)
    )


def test_none_leaves_ddp_alone(group: None) -> None:
    assert comm_hooks.build(_cfg(), [], 0) is None
    ddp = DDP(_model())
    comm_hooks.register(ddp, None, None)  # nothing registered: a later registration works
    comm_hooks.register(ddp, comm_hooks.build(_cfg(comm_hook="fp16"), [], 0), None)


def _powersgd(start: int = 2) -> tuple[DDP, comm_hooks.PowerSGD]:
    ddp = DDP(_model(), bucket_cap_mb=0.002)  # several buckets once DDP rebuilds them
    hook = comm_hooks.build(
        _cfg(comm_hook="powersgd", powersgd_start_step=start, powersgd_rank=2),
        list(ddp.module.parameters()),
        seed=7,
    )
    assert hook is not None and isinstance(hook.part, comm_hooks.PowerSGD)
    comm_hooks.register(ddp, hook, None)
    return ddp, hook.part


@pytest.mark.parametrize("saved_after", [1, 2, 5])  # before, at and after compression starts
def test_powersgd_state_restores_bit_for_bit_in_a_new_ddp(group: None, saved_after: int) -> None:
    """A fresh DDP module starts with other buckets than the one the state was saved from (DDP
    rebuilds them after its first step): the restored run still computes what the first did."""
    first, state = _powersgd()
    for seed in range(saved_after):
        _step(first, seed)
    saved = state.state_dict()
    resumed, restored = _powersgd()
    resumed.module.load_state_dict(first.module.state_dict())
    restored.load_rank_states([copy.deepcopy(saved)], 0, 1)
    for seed in range(saved_after, saved_after + 4):
        want, got = _step(first, seed), _step(resumed, seed)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), f"step {seed + 1} after a resume at {saved_after}"
    assert state.state.iter == restored.state.iter == saved_after + 4
    errors = [d["error"] for d in state.state_dict()["params"].values()]
    assert errors and any(e.abs().sum() > 0 for e in errors)  # error feedback is in play


def test_on_gloo_a_powersgd_bucket_starts_when_the_one_before_is_done(group: None) -> None:
    """powerSGD_hook waits inside its callbacks on gloo's two threads: two buckets in flight
    can hold both (seen here as a hang under pytest-xdist). Each bucket's future is made to
    complete 50 ms late: the next bucket must still find it done."""
    ddp, psgd = _powersgd(start=2)
    real, futures, seen = psgd._hook, [], []

    def late(state, bucket):  # noqa: ANN001, ANN202
        seen.append([f.done() for f in futures])
        done = torch.futures.Future()
        real(state, bucket).then(
            lambda fut: threading.Timer(0.05, done.set_result, (fut.value(),)).start()
        )
        futures.append(done)
        return done

    psgd._hook = late
    for seed in range(4):  # plain all-reduce, then PowerSGD's chain of three
        futures.clear()
        _step(ddp, seed)
    # one bucket in DDP's first step, two in each step once it rebuilt them
    assert sum(1 for done in seen if done) >= 3 and all(all(done) for done in seen), seen


def test_powersgd_really_compresses(group: None) -> None:
    plain = DDP(_model())
    compressed, _ = _powersgd(start=2)
    grads = [(_step(compressed, s), _step(plain, s)) for s in range(3)]
    same = [all(torch.equal(a, b) for a, b in zip(c, p, strict=True)) for c, p in grads]
    assert same == [True, True, False]  # plain all-reduce for 2 steps, then PowerSGD


def test_powersgd_state_is_per_rank_and_reset_at_another_world_size(group: None) -> None:
    _, state = _powersgd()
    saved = {"iter": 9, "params": {0: {"error": torch.ones(3)}}}
    state.load_rank_states([saved, saved], 0, 1)  # saved by 2 ranks, resumed by 1
    assert state.state.iter == 9 and state.kept == {}
    state.load_rank_states([saved], 0, 1)
    assert set(state.kept) == {0}


def test_the_config_refuses_an_unknown_hook_and_a_start_before_step_two() -> None:
    from kubeddp.trainer.config import ConfigError

    with pytest.raises(ConfigError, match="ddp.comm_hook.*use one of none, bf16, fp16"):
        config_from_dict({"ddp": {"comm_hook": "int8"}})
    with pytest.raises(ConfigError, match="ddp.powersgd_start_step.*>= 2"):
        config_from_dict({"ddp": {"powersgd_start_step": 1}})


def test_without_a_chosen_hook_one_gradient_hook_marks_the_end_of_backward(group: None) -> None:
    """DDP keeps its own all-reduce (no Python comm hook: no extra pass over the gradients);
    the mark comes from the parameter whose gradient is accumulated last, learned over the
    first passes, after which only that parameter has a hook: one call per step."""
    marks: list[tuple[int, int]] = []  # (step, gradients accumulated when the mark came)
    ddp = DDP(_model())
    step = 0

    def mark() -> None:
        marks.append((step, sum(p.grad is not None for p in ddp.parameters())))

    last = grad_ready.LastGradient(list(ddp.parameters()), mark)
    for step in range(5):
        _step(ddp, step)
        last.step_done()
    counts = [sum(1 for s, _ in marks if s == n) for n in range(5)]
    params = len(list(ddp.parameters()))
    assert counts[: grad_ready.LEARN_PASSES] == [params] * grad_ready.LEARN_PASSES
    assert counts[grad_ready.LEARN_PASSES :] == [1] * (5 - grad_ready.LEARN_PASSES)
    # the settled mark comes when every gradient is there: the last one's
    assert all(n == params for s, n in marks if s >= grad_ready.LEARN_PASSES)
    assert len(last.handles) == 1
    # the gradients are DDP's own all-reduce's: what a model without the mark gets
    plain = DDP(_model())
    for got, want in zip(_step(ddp, 9), _step(plain, 9), strict=True):
        assert torch.equal(got, want)
    last.close()
    assert last.handles == []
