"""Faults for the diagnostics tests, injected into one rank of a real run.

A `workload.name=custom` workload (the regression model and data) whose `workload.args` say
which fault, on which rank, from which step:

- `sleep_data`: the rank's dataset sleeps (an hour) once it reaches that step's samples (with
  `first_group_only: true`, in the first worker group only);
- `deadlock`: the rank's forward deadlocks: it holds lock A and waits for B, which a thread it
  started holds while that thread waits for A;
- `nan`: the rank's loss at that step is NaN;
- `slow`: every rank's forward sleeps `work_ms` (standing in for compute), the rank twice as
  long: it is a 2x straggler. With rank -1 no rank is slowed (a healthy run).
- `die_at_teardown`: the rank is SIGKILLed when the trainer drops its loss, after training
  and before the final barrier (a pod lost in the run's last moment).
- `die`: the rank SIGKILLs itself in that step's forward, in the first worker group only
  (torchrun's restarted workers, and those of a pod that rejoined, train on).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from kubeddp.trainer.config import WorkloadConfig
from kubeddp.trainer.process_contract import ENV_REJOINED
from kubeddp.trainer.workloads.regression import make_data, make_mlp, mse_loss

DATA_SEED = 1234


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class SleepingDataset(Dataset):
    def __init__(self, inner: Dataset, after_samples: int | None) -> None:
        self.inner, self.after, self.served = inner, after_samples, 0

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        self.served += 1
        if self.after is not None and self.served > self.after:
            sleep_in_data_loader()
        return self.inner[index]


def _first_group() -> bool:
    """The first workers of the run: not restarted by torchrun, not started again in a pod
    that rejoined the rendezvous."""
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    return not restarted and os.environ.get(ENV_REJOINED) != "1"


def sleep_in_data_loader() -> None:
    time.sleep(3600)


def deadlock() -> None:
    """Two threads, two locks, taken in opposite orders: neither ever returns."""
    a, b = threading.Lock(), threading.Lock()
    holding_b = threading.Event()

    def other() -> None:
        with b:
            holding_b.set()
            time.sleep(0.2)
            with a:
                pass

    with a:
        threading.Thread(target=other, name="deadlock-partner", daemon=True).start()
        holding_b.wait()
        with b:
            pass


class FaultyLoss:
    def __init__(self, args: dict[str, Any]) -> None:
        self.fault = args.get("fault", "")
        self.on_me = _rank() == int(args.get("rank", -1))
        self.step = int(args.get("step", 0))
        self.work = float(args.get("work_ms", 0)) / 1000.0
        self.calls = 0

    def __del__(self) -> None:
        if self.on_me and self.fault == "die_at_teardown":
            os.kill(os.getpid(), signal.SIGKILL)

    def __call__(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self.calls += 1
        if self.fault == "slow" and self.work:
            time.sleep(self.work * (2 if self.on_me else 1))
        if self.on_me and self.calls == self.step and self.fault == "deadlock":
            deadlock()
        loss = mse_loss(model, batch)
        if self.on_me and self.calls == self.step and self.fault == "die" and _first_group():
            os.kill(os.getpid(), signal.SIGKILL)
        if self.on_me and self.calls == self.step and self.fault == "nan":
            loss = loss * float("nan")
        return loss


def model(cfg: WorkloadConfig) -> tuple[nn.Module, Any]:
    return make_mlp(cfg.input_dim, cfg.hidden_dim), FaultyLoss(cfg.args)


def data(cfg: WorkloadConfig) -> tuple[Dataset, Dataset]:
    args = cfg.args
    train_set, eval_set = make_data(cfg.samples, cfg.input_dim, DATA_SEED)
    after = None
    if (
        args.get("fault") == "sleep_data"
        and _rank() == int(args.get("rank", -1))
        and (_first_group() or not args.get("first_group_only"))
    ):
        after = (int(args["step"]) - 1) * int(args["batch_size"])
    return SleepingDataset(train_set, after), eval_set


def settings(fault: str, rank: int, step: int, samples: int = 4096, **extra: Any) -> list[str]:
    """`--set` overrides for this workload with the fault."""
    args = {"fault": fault, "rank": rank, "step": step, **extra}
    shown = ", ".join(f"{k}: {v}" for k, v in args.items())
    return [
        "--set", "workload.name=custom",
        "--set", "workload.model=tests.helpers.faults:model",
        "--set", "workload.data=tests.helpers.faults:data",
        "--set", f"workload.samples={samples}",
        "--set", f"workload.args={{{shown}}}",
    ]  # fmt: skip
