"""The built-in and bring-your-own workloads: determinism, learning, and one-line errors."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from kubeddp.trainer.config import ConfigError, WorkloadConfig, load_config
from kubeddp.trainer.workloads import Workload, WorkloadError, build_workload

EXAMPLES = "kubeddp.trainer.workloads.examples"
pytestmark = pytest.mark.timeout(120)


def tiny_charlm_cfg(corpus: Path | str, **overrides: object) -> WorkloadConfig:
    fields = {
        "name": "charlm",
        "corpus": str(corpus),
        "seq_len": 16,
        "n_layer": 1,
        "n_head": 2,
        "n_embd": 32,
    }
    fields.update(overrides)
    return WorkloadConfig(**fields)


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    """~12 KB of English-like text with enough repetition to learn from in a few dozen steps."""
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "and",
        "the",
        "dog",
        "ran",
        "to",
        "the",
        "red",
        "barn",
        "by",
        "the",
        "old",
        "mill",
    ]
    gen = torch.Generator().manual_seed(7)
    lines = []
    for _ in range(400):
        picks = torch.randint(len(words), (6,), generator=gen).tolist()
        lines.append(" ".join(words[i] for i in picks) + ".")
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def mean_loss(workload: Workload, batches: list) -> float:
    workload.model.eval()
    with torch.no_grad():
        losses = [workload.loss_fn(workload.model, batch).item() for batch in batches]
    workload.model.train()
    return sum(losses) / len(losses)


def train_steps(workload: Workload, steps: int, lr: float, batch_size: int = 32) -> tuple:
    """Eval loss on fixed train batches before and after `steps` AdamW steps."""
    sampler = RandomSampler(
        workload.train_set,
        generator=torch.Generator().manual_seed(0),
        num_samples=steps * batch_size,
    )
    batches = list(DataLoader(workload.train_set, batch_size=batch_size, sampler=sampler))
    probe = batches[:4]
    before = mean_loss(workload, probe)
    optimizer = torch.optim.AdamW(workload.model.parameters(), lr=lr)
    for batch in batches:
        loss = workload.loss_fn(workload.model, batch)
        assert loss.dim() == 0
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return before, mean_loss(workload, probe)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def same_item(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def all_configs(text_file: Path) -> list[WorkloadConfig]:
    return [
        WorkloadConfig(name="regression", samples=256),
        tiny_charlm_cfg(text_file),
        WorkloadConfig(name="custom", model=f"{EXAMPLES}:make_model", data=f"{EXAMPLES}:make_data"),
    ]


# ---- determinism ----------------------------------------------------------------------------


def test_same_seed_same_weights_and_items(text_file: Path) -> None:
    for cfg in all_configs(text_file):
        first, second = build_workload(cfg, seed=5), build_workload(cfg, seed=5)
        assert same_weights(first.model, second.model), cfg.name
        assert len(first.train_set) == len(second.train_set) > 0
        for index in (0, len(first.train_set) // 2, len(first.train_set) - 1):
            assert same_item(first.train_set[index], second.train_set[index]), cfg.name
        assert same_item(first.eval_set[0], second.eval_set[0])
        other = build_workload(cfg, seed=6)
        assert not same_weights(first.model, other.model), cfg.name
        assert first.description and "\n" not in first.description


def test_build_leaves_global_rng_alone(text_file: Path) -> None:
    torch.manual_seed(99)
    expected = torch.rand(3)
    torch.manual_seed(99)
    for cfg in all_configs(text_file):
        build_workload(cfg, seed=1)
    assert torch.equal(torch.rand(3), expected)


# ---- regression -----------------------------------------------------------------------------


def test_regression_learns() -> None:
    workload = build_workload(WorkloadConfig(name="regression", samples=1024), seed=0)
    assert workload.tokens_per_sample == 0
    assert len(workload.train_set) + len(workload.eval_set) == 1024
    before, after = train_steps(workload, steps=40, lr=1e-2)
    assert after < 0.3 * before, (before, after)


def test_regression_rejects_too_few_samples() -> None:
    with pytest.raises(WorkloadError, match="workload.samples is 1"):
        build_workload(WorkloadConfig(name="regression", samples=1), seed=0)


# ---- charlm ---------------------------------------------------------------------------------


def test_charlm_windows_cover_the_corpus_in_order(text_file: Path) -> None:
    workload = build_workload(tiny_charlm_cfg(text_file), seed=0)
    assert workload.tokens_per_sample == 16
    data = text_file.read_bytes()
    split = int(len(data) * 0.9)
    x0, y0 = workload.train_set[0]
    assert x0.dtype == torch.long and x0.shape == (16,)
    assert torch.equal(y0[:-1], x0[1:])
    rebuilt = b"".join(bytes(workload.train_set[i][0].tolist()) for i in range(3))
    assert rebuilt == data[:48]
    assert bytes(workload.eval_set[0][0].tolist()) == data[split : split + 16]
    assert len(workload.train_set) == (split - 1) // 16
    with pytest.raises(IndexError):
        workload.train_set[len(workload.train_set)]


def test_charlm_learns_on_a_small_corpus(text_file: Path) -> None:
    workload = build_workload(tiny_charlm_cfg(text_file), seed=0)
    before, after = train_steps(workload, steps=40, lr=1e-2)
    assert before > 4.0  # about ln(256) = 5.5 untrained
    assert after < 0.6 * before, (before, after)


def test_charlm_attention_is_causal(text_file: Path) -> None:
    """Changing byte t must not change the predictions at positions before t."""
    workload = build_workload(tiny_charlm_cfg(text_file), seed=0)
    workload.model.eval()
    tokens = workload.train_set[0][0].unsqueeze(0)
    changed = tokens.clone()
    changed[0, 10] = (changed[0, 10] + 1) % 256
    with torch.no_grad():
        original, altered = workload.model(tokens), workload.model(changed)
    assert torch.allclose(original[:, :10], altered[:, :10])
    assert not torch.allclose(original[:, 10:], altered[:, 10:])


def test_charlm_default_corpus_is_the_stdlib() -> None:
    cfg = WorkloadConfig(name="charlm", corpus_max_bytes=40_000)
    first, second = build_workload(cfg, seed=0), build_workload(cfg, seed=0)
    assert "Python stdlib" in first.description
    assert "0.04M bytes" in first.description
    assert first.description == second.description  # includes the corpus sha256
    assert len(first.train_set) == (36_000 - 1) // cfg.seq_len
    logits = first.model(first.train_set[0][0].unsqueeze(0))
    assert logits.shape == (1, cfg.seq_len, 256)


def test_charlm_reads_a_directory_in_sorted_order(tmp_path: Path, text_file: Path) -> None:
    corpus = tmp_path / "books"
    (corpus / "b").mkdir(parents=True)
    (corpus / "b" / "2.txt").write_bytes(text_file.read_bytes())
    (corpus / "a.txt").write_bytes(b"A" * 500)
    workload = build_workload(tiny_charlm_cfg(corpus, corpus_max_bytes=1000), seed=0)
    assert bytes(workload.train_set[0][0].tolist()) == b"A" * 16
    assert "0.00M bytes" in workload.description  # 1000 bytes: the limit holds


def test_charlm_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="is not a file or directory") as missing:
        build_workload(tiny_charlm_cfg(tmp_path / "nope.txt"), seed=0)
    small = tmp_path / "small.txt"
    small.write_text("hello")
    with pytest.raises(WorkloadError, match="has 5 bytes; seq_len 16 needs at least") as short:
        build_workload(tiny_charlm_cfg(small), seed=0)
    for err in (missing, short):
        assert "\n" not in str(err.value)
        assert isinstance(err.value, ConfigError)


# ---- custom ---------------------------------------------------------------------------------


def custom_cfg(model: str = f"{EXAMPLES}:make_model", data: str = f"{EXAMPLES}:make_data"):
    return WorkloadConfig(name="custom", model=model, data=data, samples=512, input_dim=8)


def test_custom_forward_returns_loss() -> None:
    workload = build_workload(custom_cfg(), seed=0)
    assert len(workload.train_set) == 461 and len(workload.eval_set) == 51
    assert "examples:make_model" in workload.description
    before, after = train_steps(workload, steps=40, lr=5e-2)
    assert after < 0.3 * before, (before, after)


def test_custom_model_and_loss_tuple_and_train_only_data() -> None:
    cfg = custom_cfg(f"{EXAMPLES}:make_model_and_loss", f"{EXAMPLES}:make_train_only")
    workload = build_workload(cfg, seed=0)
    assert workload.eval_set is None
    assert "no eval" in workload.description
    before, after = train_steps(workload, steps=40, lr=5e-2)
    assert after < 0.5 * before, (before, after)


def test_custom_factories_read_workload_args() -> None:
    """workload.args reaches the factories: the model is as wide and deep as it says."""
    cfg = load_config(
        None,
        [
            "workload.name=custom",
            f"workload.model={EXAMPLES}:make_mlp",
            f"workload.data={EXAMPLES}:make_data",
            "workload.args={hidden: 7, layers: 2}",
            "workload.samples=512",
            "workload.input_dim=8",
        ],
    )
    workload = build_workload(cfg.workload, seed=0)
    widths = [m.out_features for m in workload.model.modules() if isinstance(m, torch.nn.Linear)]
    assert widths == [7, 7, 1]
    before, after = train_steps(workload, steps=40, lr=5e-2)
    assert after < before, (before, after)
    # The model's own sizes are part of its hash: a checkpoint of another size is refused.
    other = load_config(None, ["workload.args={hidden: 8, layers: 2}"])
    assert cfg.model_hash() != other.model_hash()


BAD_FACTORIES = """
    import torch
    from torch.utils.data import IterableDataset, TensorDataset

    NOT_CALLABLE = 3

    def returns_int(cfg):
        return 3

    def returns_string(cfg):
        return "data.csv"

    def returns_three(cfg):
        ds = TensorDataset(torch.zeros(4, 1))
        return ds, ds, ds

    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.zeros(1)

    def returns_stream(cfg):
        return Stream()

    def returns_empty(cfg):
        return TensorDataset(torch.zeros(0, 1)), None

    def returns_none(cfg):
        return None
"""


@pytest.fixture
def bad_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "kubeddp_bad_factories.py").write_text(textwrap.dedent(BAD_FACTORIES))
    (tmp_path / "kubeddp_fails_on_import.py").write_text("import kubeddp_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "kubeddp_bad_factories"


@pytest.mark.parametrize(
    ("model", "data", "expected"),
    [
        (
            "no_colon_here",
            "{ex}:make_data",
            r"workload.model 'no_colon_here' must look like "
            r"'pkg.module:factory'",
        ),
        (
            "kubeddp_missing_pkg.models:make",
            "{ex}:make_data",
            r"cannot import module 'kubeddp_missing_pkg.models' \(No module named "
            r"'kubeddp_missing_pkg'\); install the package",
        ),
        (
            "kubeddp_fails_on_import:make",
            "{ex}:make_data",
            r"cannot import module 'kubeddp_fails_on_import' \(No module named "
            r"'kubeddp_no_such_dependency'\)",
        ),
        (
            "{bad}:make_modle",
            "{ex}:make_data",
            r"module 'kubeddp_bad_factories' has no attribute 'make_modle'",
        ),
        ("{bad}:NOT_CALLABLE", "{ex}:make_data", r"is int 3, not callable"),
        (
            "{bad}:returns_int",
            "{ex}:make_data",
            r"workload.model '.*:returns_int' returned int 3; expected an nn.Module whose "
            r"forward\(batch\) returns the scalar loss",
        ),
        (
            "{ex}:make_model",
            "{bad}:returns_string",
            r"workload.data '.*:returns_string' returned str 'data.csv'; expected a map-style "
            r"Dataset",
        ),
        ("{ex}:make_model", "{bad}:returns_three", r"returned a tuple of 3 items"),
        (
            "{ex}:make_model",
            "{bad}:returns_stream",
            r"returned Stream .* as train_set; expected "
            r"a map-style Dataset",
        ),
        ("{ex}:make_model", "{bad}:returns_empty", r"returned an empty train_set"),
        ("{ex}:make_model", "{bad}:returns_none", r"returned NoneType None"),
    ],
)
def test_custom_errors_are_one_line(bad_module: str, model: str, data: str, expected: str) -> None:
    cfg = custom_cfg(
        model.format(ex=EXAMPLES, bad=bad_module), data.format(ex=EXAMPLES, bad=bad_module)
    )
    with pytest.raises(WorkloadError, match=expected) as err:
        build_workload(cfg, seed=0)
    assert "\n" not in str(err.value)


def test_unknown_workload_name() -> None:
    with pytest.raises(WorkloadError, match="workload.name 'gpt5' is unknown; use one of"):
        build_workload(WorkloadConfig(name="gpt5"), seed=0)


def test_each_module_of_the_workloads_package_is_a_workload() -> None:
    """A new workload is one file in trainer/workloads/: the config's choices, the schema and
    the builder find it by its module name."""
    import importlib
    import pkgutil

    import kubeddp.trainer.workloads as package
    from kubeddp.trainer.config import NOT_WORKLOAD_MODULES, WorkloadConfig, workload_names

    modules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    assert set(workload_names()) == modules - set(NOT_WORKLOAD_MODULES)
    for name in workload_names():
        assert callable(importlib.import_module(f"{package.__name__}.{name}").build), name
    for name in NOT_WORKLOAD_MODULES:
        assert not hasattr(importlib.import_module(f"{package.__name__}.{name}"), "build"), name
    choices = dataclasses.fields(WorkloadConfig)[0].metadata["choices"]
    assert tuple(choices) == workload_names()
