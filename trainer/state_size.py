"""How many bytes one snapshot of a built-in workload's training state takes, from its config
alone (no torch): what the chart reserves in each pod's memory for the in-memory snapshots
(two of them) when memorySnapshots.size is not given.

The counts are written once, as sums of terms over the workload's settings (MODEL_TERMS);
`make chart` writes the same table into the chart's constants, whose template
(charts/kubeddp/templates/_snapshots.tpl) evaluates it the same way. tests/unit/test_state_size.py
builds every built-in workload and checks the counts against the real model and optimizer.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from kubeddp.trainer.config import TrainConfig, WorkloadConfig

FLOAT_BYTES = 4  # the built-in workloads train in fp32 (AMP keeps fp32 weights)
# What a snapshot holds beside the tensors' bytes: the skeleton, the config copy, the RNG
# streams of every rank (~5 KiB each), each tensor's alignment
OVERHEAD_BYTES = 1 << 20
OPTIMIZER_MOMENTS = {"adamw": 2, "sgd": 1}  # fp32 tensors per parameter in the optimizer state

Term = tuple[int, tuple[str, ...]]  # coefficient times the product of these workload settings
_CHARLM_PARAMS: list[Term] = [
    (256, ("n_embd",)),  # byte embedding (the head shares it)
    (1, ("seq_len", "n_embd")),  # position embedding
    (12, ("n_layer", "n_embd", "n_embd")),  # per block: attention qkv and proj, MLP 4x
    (13, ("n_layer", "n_embd")),  # their biases and the block's two LayerNorms
    (2, ("n_embd",)),  # the final LayerNorm
]
_REGRESSION: list[Term] = [(1, ("input_dim", "hidden_dim")), (2, ("hidden_dim",)), (1, ())]
# Per built-in workload: numbers in the model's state_dict, and in its distinct parameters
MODEL_TERMS: dict[str, dict[str, list[Term]]] = {
    "charlm": {"state": [*_CHARLM_PARAMS, (256, ("n_embd",))], "params": _CHARLM_PARAMS},
    "regression": {"state": _REGRESSION, "params": _REGRESSION},
}


def _evaluate(terms: list[Term], settings: dict[str, Any]) -> int:
    total = 0
    for coefficient, names in terms:
        product = coefficient
        for name in names:
            product *= int(settings[name])
        total += product
    return total


def model_numel(w: WorkloadConfig) -> tuple[int, int] | None:
    """(numbers in the model's state_dict, numbers in its distinct parameters), or None for a
    workload whose model kubeddp does not know (custom)."""
    terms = MODEL_TERMS.get(w.name)
    if terms is None:
        return None
    settings = asdict(w)
    return _evaluate(terms["state"], settings), _evaluate(terms["params"], settings)


def snapshot_bytes(workload: WorkloadConfig, train: TrainConfig) -> int | None:
    """One snapshot of the built-in trainer's state (model, optimizer, the rest), or None."""
    counts = model_numel(workload)
    if counts is None:
        return None
    state, params = counts
    moments = OPTIMIZER_MOMENTS[train.optimizer]
    return (state + moments * params) * FLOAT_BYTES + OVERHEAD_BYTES


def constants_for_chart() -> dict[str, Any]:
    """The table and the defaults it reads, for the chart's template."""
    workload, train = WorkloadConfig(), TrainConfig()
    return {
        "terms": {
            name: {part: [[c, list(n)] for c, n in terms] for part, terms in parts.items()}
            for name, parts in MODEL_TERMS.items()
        },  # fmt: skip
        "moments": OPTIMIZER_MOMENTS,
        "floatBytes": FLOAT_BYTES,
        "overheadBytes": OVERHEAD_BYTES,
        "workloadDefaults": {k: v for k, v in asdict(workload).items() if not isinstance(v, dict)},
        "defaultOptimizer": train.optimizer,
    }
