"""Test workloads for `workload.name=custom`: the built-in regression model and data, with an
optional delay per sample so a multi-process test can act (kill, signal) mid-epoch.

The delay only slows data loading; the model, the data and the maths are the regression
workload's, so a run with the delay and one without produce the same parameters.

    --set workload.name=custom
    --set workload.model=tests.helpers.workloads:regression_model
    --set workload.data=tests.helpers.workloads:regression_data
"""

from __future__ import annotations

import os
import time
from typing import Any

from torch import nn
from torch.utils.data import Dataset

from kubeddp.trainer.config import WorkloadConfig
from kubeddp.trainer.workloads.regression import make_data, make_mlp, mse_loss

DELAY_ENV = "KUBEDDP_TEST_SAMPLE_DELAY"  # seconds per sample, read in each worker
DATA_SEED = 1234


class DelayedDataset(Dataset):
    def __init__(self, inner: Dataset, delay_seconds: float) -> None:
        self.inner = inner
        self.delay_seconds = delay_seconds

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        if self.delay_seconds > 0:
            time.sleep(self.delay_seconds)
        return self.inner[index]


def regression_model(cfg: WorkloadConfig) -> tuple[nn.Module, Any]:
    return make_mlp(cfg.input_dim, cfg.hidden_dim), mse_loss


def regression_data(cfg: WorkloadConfig) -> tuple[Dataset, Dataset]:
    delay = float(os.environ.get(DELAY_ENV, "0") or 0)
    train_set, eval_set = make_data(cfg.samples, cfg.input_dim, DATA_SEED)
    return DelayedDataset(train_set, delay), eval_set


def settings(samples: int) -> list[str]:
    """`--set` overrides selecting this workload with `samples` rows (10% go to eval)."""
    return [
        "--set",
        "workload.name=custom",
        "--set",
        "workload.model=tests.helpers.workloads:regression_model",
        "--set",
        "workload.data=tests.helpers.workloads:regression_data",
        "--set",
        f"workload.samples={samples}",
    ]
