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

import os
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import torch


def compile_plan(setting: str, device: torch.device) -> tuple[bool, str | None]:
    """train.compile -> (compile?, a note for the log). on, off, or auto = on when training on
    CUDA where the build tools (`missing_build_tools`) are present; otherwise auto trains
    eagerly and says why. (On CPU inductor gained nothing measurable for the built-in
    workloads.) `on` without the tools is a ValueError: one line, exit 2, before training."""
    if setting == "off" or (setting == "auto" and device.type != "cuda"):
        return False, None
    missing = missing_build_tools(device)
    if missing is None:
        return True, None
    if setting == "on":
        raise ValueError(
            f"train.compile=on needs {missing}; install it in the image or set "
            "train.compile=off (or auto, which then trains eagerly)"
        )
    return False, f"train.compile=auto: training eagerly: torch.compile needs {missing}"


def missing_build_tools(device: torch.device) -> str | None:
    """What torch.compile would lack to build its kernels here, or None.

    Compiled code is built at run time: on CUDA, Triton compiles a C launcher against Python.h
    with $CC, else gcc, else clang; on CPU, inductor compiles C++ with $CXX, else g++. Without
    them the first compiled step fails deep inside torch, so this is checked before training.
    """
    if device.type == "cuda":
        if not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")):
            return "a C compiler for Triton (gcc or clang on PATH, or $CC)"
        scheme = sysconfig.get_default_scheme()
        scheme = "posix_prefix" if scheme == "posix_local" else scheme  # as Triton picks it
        include = Path(sysconfig.get_paths(scheme=scheme)["include"])
        if not (include / "Python.h").is_file():
            return f"Python's C headers for Triton ({include}/Python.h: install python3-dev)"
        return None
    if not (os.environ.get("CXX") or shutil.which("g++")):
        return "a C++ compiler for inductor (g++ on PATH, or $CXX)"
    return None


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
