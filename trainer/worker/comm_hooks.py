"""ddp.comm_hook: PyTorch's own DDP communication hooks, registered once per DDP module.

- `bf16`, `fp16`: `default_hooks.bf16_compress_hook` / `fp16_compress_hook` cast each gradient
  bucket to half precision for its all-reduce and back: half the bytes on the wire.
- `powersgd`: `powerSGD_hook.powerSGD_hook`, a rank-r approximation of each gradient matrix with
  error feedback (what the approximation missed is added to the next step's gradient) and warm
  start (last step's factors start the next). Plain all-reduce for `ddp.powersgd_start_step`
  steps first.

DDP takes one hook, so the straggler measurement's mark (the moment this rank's gradients are
ready, collectives.watch_ddp) runs first inside the same hook, then the chosen one; without a
chosen hook the mark is a gradient hook instead (grad_ready.py: a Python all-reduce hook would
cost a pass over the gradients). Gradient accumulation needs nothing: DDP calls the hook only on
the micro-step that syncs.

PowerSGD's state (error feedback, warm-start factors) is keyed by DDP's bucket index, and DDP
builds its buckets in one order for a process's first step and rebuilds them in the gradients'
ready order after it: a resumed process's first step has other buckets than the ones the state
was saved with. So `PowerSGD` keeps the state per parameter between layouts (and in the
checkpoint), and hands the hook the bucket-keyed state of the current layout: a resumed run
computes bit for bit what an uninterrupted one does. Its Q factors start from a seed per
parameter (train.seed), not per bucket, for the same reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kubeddp.trainer.config import DDPConfig

HOOKS = ("none", "bf16", "fp16", "powersgd")


@dataclass(frozen=True)
class CommHook:
    """What DDP calls for each gradient bucket: `fn(state, bucket)`; `part`: the state a
    checkpoint keeps (None when the hook has none)."""

    fn: Callable[[Any, Any], Any]
    state: Any = None
    part: Any = None


def build(cfg: DDPConfig, parameters: list[torch.nn.Parameter], seed: int) -> CommHook | None:
    """The hook ddp.comm_hook names; None for `none` (DDP's own all-reduce)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if cfg.comm_hook == "bf16":
        return CommHook(default_hooks.bf16_compress_hook)
    if cfg.comm_hook == "fp16":
        return CommHook(default_hooks.fp16_compress_hook)
    if cfg.comm_hook == "powersgd":
        psgd = PowerSGD(cfg, parameters, seed)
        return CommHook(psgd, part=psgd)
    return None


def register(model: Any, hook: CommHook | None, on_ready: Callable[[], None] | None) -> None:
    """Register `hook` on a DDP `model`, with `on_ready` called first for every bucket; nothing
    when there is neither (DDP's own all-reduce, unobserved).

    Always through a wrapper: DDP refuses `bf16_compress_hook` by its name unless the group is
    NCCL on CUDA, although gloo all-reduces bfloat16 too (every torch this runs on has the
    CUDA 11+ and NCCL 2.10+ the check is about), and a job must behave the same with and
    without the straggler mark."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not isinstance(model, DDP) or (hook is None and on_ready is None):
        return
    chosen = hook or CommHook(allreduce_hook)
    inner = chosen.fn
    mark = on_ready or _nothing

    # Unannotated: torch checks the annotations of a comm hook against its own types.
    def ready_then(state, bucket):  # noqa: ANN001, ANN202
        mark()
        return inner(state, bucket)

    model.register_comm_hook(chosen.state, ready_then)


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class _Matrix:
    """How powerSGD_hook sees one gradient: a matrix (rows, cols), compressed or not."""

    rows: int
    cols: int
    rank: int
    compressed: bool


class PowerSGD:
    """PyTorch's powerSGD_hook with its state kept per parameter across bucket layouts (see the
    module's doc); a per-rank checkpoint part (each rank has its own error feedback)."""

    def __init__(self, cfg: DDPConfig, parameters: list[torch.nn.Parameter], seed: int) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        self._hook = powerSGD_hook.powerSGD_hook
        self.state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=cfg.powersgd_start_step,
            min_compression_rate=cfg.powersgd_min_compression,
            use_error_feedback=True,
            warm_start=True,
            random_seed=seed,
        )
        self.seed = seed
        self.index = {id(p): i for i, p in enumerate(parameters)}
        self.matrices = [self._matrix(p.shape) for p in parameters]
        self.layout: dict[int, tuple[int, ...]] = {}  # bucket index -> its parameters' indices
        self.kept: dict[int, dict[str, torch.Tensor]] = {}  # parameter -> error, p, q
        # powerSGD_hook waits for its second and third all-reduce inside the callbacks of the
        # first, on the thread that completed it: on gloo, a pool of 2 threads, so two buckets
        # in flight can hold both threads waiting for work that neither is free to run. On
        # gloo a bucket's hook therefore starts when the bucket before is done (in the
        # backward thread, which gloo does not need); NCCL's callbacks do not hold its work.
        self.serial: bool | None = None  # decided at the first bucket: the group exists then
        self.pending: Any = None  # the last bucket's future

    def _matrix(self, shape: torch.Size) -> _Matrix:
        rows = shape[0] if len(shape) else 1
        cols = math.prod(shape) // rows if rows else 0
        rank = min(rows, cols, self.state.matrix_approximation_rank)
        # powerSGD_hook's test (its PowerSGDState doc): worth it when the factors are smaller
        compressed = (rows + cols) * rank * self.state.min_compression_rate < rows * cols
        return _Matrix(rows, cols, rank, compressed)

    def __call__(self, state: Any, bucket: Any) -> Any:
        del state  # registered with None: the hook's state is ours
        if self.serial is None:
            import torch.distributed as dist

            self.serial = dist.get_backend() == "gloo"
        if self.serial and self.pending is not None:
            self.pending.wait()  # see __init__
        if self.state.iter >= self.state.start_powerSGD_iter:
            index = bucket.index()
            members = tuple(self.index[id(p)] for p in bucket.parameters())
            known = self.layout.get(index)
            if known != members:
                if known is not None:  # DDP rebuilt its buckets: a new step, a new layout
                    self._keep_from(index)
                self._hand_over(index, members, bucket.buffer())
        self.pending = self._hook(self.state, bucket)
        return self.pending

    # ---- between the hook's bucket-keyed state and the per-parameter one -------------------
    def _slices(self, members: tuple[int, ...]) -> dict[str, list[tuple[int, int, int]]]:
        """Where each parameter's part lies in the bucket's error, p and q tensors: (parameter,
        start, length), in powerSGD_hook's order (p and q: the compressed matrices grouped by
        shape, groups in order of first appearance)."""
        error, start = [], 0
        groups: dict[tuple[int, int], list[int]] = {}
        for i in members:
            m = self.matrices[i]
            error.append((i, start, m.rows * m.cols))
            start += m.rows * m.cols
            if m.compressed:
                groups.setdefault((m.rows, m.cols), []).append(i)
        p, q, p_at, q_at = [], [], 0, 0
        for i in (i for group in groups.values() for i in group):
            m = self.matrices[i]
            p.append((i, p_at, m.rows * m.rank))
            q.append((i, q_at, m.cols * m.rank))
            p_at, q_at = p_at + m.rows * m.rank, q_at + m.cols * m.rank
        return {"error": error, "p": p, "q": q}

    def _dicts(self) -> dict[str, dict[int, torch.Tensor]]:
        s = self.state
        return {"error": s.error_dict, "p": s.p_memory_dict, "q": s.q_memory_dict}

    def _keep_from(self, first: int) -> None:
        """Move the state of the old layout's buckets from `first` on to the per-parameter
        store. DDP hands its buckets to the hook in index order, so the ones before `first`
        are this step's (and their all-reduces may still run)."""
        stale = [b for b in self.layout if b >= first]
        self.kept.update(self._split(stale))
        for d in self._dicts().values():
            for b in stale:
                d.pop(b, None)
        for b in stale:
            del self.layout[b]

    def _split(self, buckets: list[int] | None = None) -> dict[int, dict[str, torch.Tensor]]:
        """The per-parameter pieces of `buckets` (all by default), as views."""
        out: dict[int, dict[str, torch.Tensor]] = {}
        for bucket in self.layout if buckets is None else buckets:
            members = self.layout[bucket]
            for kind, slices in self._slices(members).items():
                whole = self._dicts()[kind].get(bucket)
                if whole is None:
                    continue
                for i, start, length in slices:
                    out.setdefault(i, {})[kind] = whole[start : start + length]
        return out

    def _hand_over(self, bucket: int, members: tuple[int, ...], buffer: torch.Tensor) -> None:
        """The bucket's error, p and q from the per-parameter store; what is missing starts as
        powerSGD_hook starts it (zero error, random Q), Q from a seed per parameter."""
        for kind, slices in self._slices(members).items():
            pieces = [self._piece(kind, i, length, buffer) for i, _, length in slices]
            self._dicts()[kind][bucket] = torch.cat(pieces) if pieces else buffer.new_empty(0)
        for i in members:
            self.kept.pop(i, None)
        self.layout[bucket] = members

    def _piece(self, kind: str, i: int, length: int, buffer: torch.Tensor) -> torch.Tensor:
        kept = self.kept.get(i, {}).get(kind)
        if kept is not None and kept.numel() == length:
            return kept.to(buffer.device, buffer.dtype)
        if kind == "q":
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            return torch.randn(length, generator=generator).to(buffer.device, buffer.dtype)
        return torch.zeros(length, device=buffer.device, dtype=buffer.dtype)

    # ---- the checkpoint part (PerRank: each rank's own error feedback) ----------------------
    def state_dict(self) -> dict[str, Any]:
        kept = {**self.kept, **self._split()}
        params = {i: {k: t.detach().cpu().clone() for k, t in d.items()} for i, d in kept.items()}
        return {"iter": self.state.iter, "params": params}

    def load_rank_states(self, states: list[Any], rank: int, world_size: int) -> None:
        """This rank's state at the same world size (where rank i's error feedback is rank i's
        to continue); else PowerSGD starts afresh, at the saved step count."""
        if not states or len(states) <= rank or not states[rank]:
            return
        mine = states[rank] if len(states) == world_size else {"iter": states[0]["iter"]}
        self.state.iter = int(mine["iter"])
        for d in self._dicts().values():
            d.clear()
        self.layout.clear()
        self.kept = {int(i): dict(d) for i, d in mine.get("params", {}).items()}
