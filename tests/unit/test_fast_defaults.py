"""The decisions behind the fast defaults on CUDA, each a function tested here without a GPU:
the AdamW kernel, TF32, pinned batches, torch.compile and which batches run compiled."""

from __future__ import annotations

import copy
import sys
import sysconfig

import pytest
import torch

from kubeddp.trainer.config import ConfigError, TrainConfig, load_config
from kubeddp.trainer.worker.compiled import (
    CompiledForFullBatches,
    compile_plan,
    missing_build_tools,
)
from kubeddp.trainer.worker.data import leading_dim, pins_memory, unpinned_host_tensors
from kubeddp.trainer.worker.precision import set_fp32_matmul_precision, tf32_enabled
from kubeddp.trainer.worker.schedule import (
    adamw_kernel,
    adamw_kernel_for,
    build_optimizer,
    restore_optimizer,
)

pytestmark = pytest.mark.timeout(60)

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


# ---- AdamW kernel --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "floating", "expected"),
    [
        ({"cuda"}, True, {"fused": True}),
        ({"cpu"}, True, {"fused": True}),
        ({"cuda", "cpu"}, True, {"foreach": True}),  # a model split across devices
        ({"meta"}, True, {"foreach": True}),  # a device without a fused kernel
        ({"cuda"}, False, {"foreach": True}),  # fused needs floating-point parameters
    ],
)
def test_adamw_kernel_by_device(
    devices: set[str], floating: bool, expected: dict[str, bool]
) -> None:
    assert adamw_kernel_for(devices, floating) == expected


def test_adamw_kernel_reads_the_parameters() -> None:
    cpu = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    assert adamw_kernel(cpu) == {"fused": True}
    meta = torch.nn.Parameter(torch.zeros(3, device="meta"))
    assert adamw_kernel([*cpu, meta]) == {"foreach": True}


def test_the_optimizer_is_built_fused_on_cpu() -> None:
    params = [torch.nn.Parameter(torch.randn(4, 4))]
    optimizer = build_optimizer(params, TrainConfig())
    assert optimizer.param_groups[0]["fused"] is True
    sgd = build_optimizer(params, TrainConfig(optimizer="sgd"))
    assert not sgd.param_groups[0].get("fused")


def _stepped(fused: bool) -> torch.optim.AdamW:
    param = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([param], lr=0.1, fused=fused or None)
    param.grad = torch.ones(4)
    optimizer.step()
    return optimizer


@pytest.mark.parametrize("saved_fused", [True, False])
def test_a_checkpoint_keeps_this_runs_kernel_choice(saved_fused: bool) -> None:
    saved = _stepped(fused=saved_fused).state_dict()
    for fused in (True, False):
        optimizer = _stepped(fused=fused)
        restore_optimizer(optimizer, copy.deepcopy(saved))  # as torch.load gives it
        group = optimizer.param_groups[0]
        assert bool(group["fused"]) is fused
        step = optimizer.state[group["params"][0]]["step"]
        assert step.item() == 1 and step.device.type == "cpu"
        group["params"][0].grad = torch.ones(4)
        optimizer.step()  # the kernel runs with the restored state
        assert optimizer.state[group["params"][0]]["step"].item() == 2


# ---- TF32 ----------------------------------------------------------------------------------


def test_tf32_only_on_cuda_and_only_when_wanted() -> None:
    assert tf32_enabled(True, CUDA)
    assert not tf32_enabled(False, CUDA)
    assert not tf32_enabled(True, CPU)


def test_cpu_matmul_precision_is_left_alone() -> None:
    before = torch.get_float32_matmul_precision()
    set_fp32_matmul_precision(True, CPU)
    assert torch.get_float32_matmul_precision() == before


# ---- pinned batches ------------------------------------------------------------------------


def test_batches_are_pinned_on_cuda_only() -> None:
    assert pins_memory(TrainConfig(), CUDA)
    assert not pins_memory(TrainConfig(pin_memory=False), CUDA)
    assert not pins_memory(TrainConfig(), CPU)


def test_unpinned_host_tensors_are_counted_in_any_batch_layout() -> None:
    x, y = torch.zeros(4, 3), torch.zeros(4)
    assert unpinned_host_tensors((x, y)) == 2
    assert unpinned_host_tensors({"inputs": x, "labels": [y, "text"]}) == 2
    assert unpinned_host_tensors(torch.zeros(4, device="meta")) == 0, "not on the host"
    assert unpinned_host_tensors(["no tensors"]) == 0


def test_leading_dim_is_the_batch_size_of_a_collated_batch() -> None:
    assert leading_dim((torch.zeros(7, 3), torch.zeros(7))) == 7
    assert leading_dim({"x": torch.zeros(5, 2)}) == 5
    assert leading_dim(torch.tensor(1.0)) is None
    assert leading_dim(["text"]) is None


# ---- torch.compile -------------------------------------------------------------------------


@pytest.fixture
def without_compilers(tmp_path, monkeypatch) -> None:
    """A PATH with python but no gcc, g++ or clang, and no $CC/$CXX: a slim image."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)


def test_compile_setting() -> None:
    """With the build tools present (this machine, CI): on, off, and auto = CUDA only."""
    assert missing_build_tools(CPU) is None and missing_build_tools(CUDA) is None
    assert compile_plan("on", CPU) == (True, None) and compile_plan("on", CUDA) == (True, None)
    assert compile_plan("off", CUDA) == (False, None)
    assert compile_plan("auto", CUDA) == (True, None) and compile_plan("auto", CPU) == (False, None)


@pytest.mark.usefixtures("without_compilers")
def test_compile_on_without_a_compiler_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^train.compile=on needs a C\+\+ compiler for inductor"):
        compile_plan("on", CPU)
    with pytest.raises(ValueError, match=r"^train.compile=on needs a C compiler for Triton") as err:
        compile_plan("on", CUDA)
    assert "\n" not in str(err.value) and "train.compile=off" in str(err.value)


@pytest.mark.usefixtures("without_compilers")
def test_compile_auto_without_a_compiler_trains_eagerly_and_says_why() -> None:
    use, note = compile_plan("auto", CUDA)
    assert not use and note.startswith("train.compile=auto: training eagerly")
    assert "a C compiler for Triton" in note
    assert compile_plan("off", CUDA) == (False, None)  # nothing to check when off


@pytest.mark.usefixtures("without_compilers")
def test_compilers_named_by_cc_and_cxx_count(monkeypatch) -> None:
    monkeypatch.setenv("CC", "/opt/toolchain/bin/cc")
    monkeypatch.setenv("CXX", "/opt/toolchain/bin/c++")
    assert missing_build_tools(CUDA) is None and missing_build_tools(CPU) is None


def test_cuda_compile_needs_pythons_headers(tmp_path, monkeypatch) -> None:
    """A Debian python3 without python3-dev: Triton's launcher cannot include Python.h."""
    real = sysconfig.get_paths

    def without_headers(*args, **kwargs):
        return {**real(*args, **kwargs), "include": str(tmp_path)}

    monkeypatch.setattr(sysconfig, "get_paths", without_headers)
    missing = missing_build_tools(CUDA)
    assert missing == f"Python's C headers for Triton ({tmp_path}/Python.h: install python3-dev)"
    assert missing_build_tools(CPU) is None  # on CPU only the C++ compiler is checked


def test_compile_accepts_the_old_booleans_and_rejects_the_rest() -> None:
    assert load_config(None, ["train.compile=true"]).train.compile == "on"
    assert load_config(None, ["train.compile=false"]).train.compile == "off"
    assert load_config(None, ["train.compile=auto"]).train.compile == "auto"
    with pytest.raises(ConfigError, match="'train.compile' is 'fast'; use one of off, on, auto"):
        load_config(None, ["train.compile=fast"])


def test_short_batches_run_the_eager_model() -> None:
    model = torch.nn.Linear(3, 1)
    wrapper = CompiledForFullBatches(model)
    called: list[str] = []
    object.__setattr__(wrapper, "compiled", lambda x: called.append("compiled") or model(x))
    x = torch.zeros(4, 3)
    wrapper(x)
    wrapper.full_batch = False
    wrapper(x)
    assert called == ["compiled"], "the short batch must not reach the compiled module"
    # The compiled module is not a second registered copy of the parameters.
    assert list(wrapper.state_dict()) == ["model.weight", "model.bias"]
