"""torch.compile for training steps, without recompiling at epoch ends or around evaluation.

A compiled graph is specialised to the shapes it first ran with. An epoch's short last batch
would make torch recompile, and (automatic dynamic shapes) switch every later step to a
graph with a symbolic batch size. So only full batches run compiled; a short one runs the
same module eagerly (one slower step per epoch, no compile). Evaluation calls the unwrapped
model eagerly (evaluator.py), and model.train()/eval() around it restores the `training`
flags the graph was compiled with, so its guards still hold.

The compiled module sits inside DDP (DDP(compiled)): DDP's own Python stays eager (compiling
DDP itself adds graph breaks in its forward on every step), and dynamo's DDPOptimizer still
splits the graph at bucket boundaries, so gradient all-reduces overlap the backward pass.
"""

from __future__ import annotations

from typing import Any

import torch


def compile_enabled(setting: str, device: torch.device) -> bool:
    """train.compile: on, off, or auto = on when training on CUDA. (On CPU inductor needs a
    C++ compiler at run time and gained nothing measurable for the built-in workloads.)"""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


class CompiledForFullBatches(torch.nn.Module):
    """`model` compiled, for the loop's full batches; eager while `full_batch` is False.

    The loop sets `full_batch` from the loader's batch (batch-first by collation), not from
    the model's inputs, whose layout is the workload's business.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        # Not a registered submodule: its parameters are `model`'s, under a second name.
        object.__setattr__(self, "compiled", torch.compile(model))
        self.full_batch = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.full_batch:
            return self.compiled(*args, **kwargs)
        return self.model(*args, **kwargs)
