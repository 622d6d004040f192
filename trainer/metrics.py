"""Training metrics recorded by each worker (placeholder: the metrics issue fills this in)."""

from __future__ import annotations

from kubeddp.trainer.config import MetricsConfig


class TrainingMetrics:
    def __init__(self, cfg: MetricsConfig, rank: int, world_size: int, backend: str) -> None:
        self.cfg = cfg

    def on_step(
        self,
        *,
        step: int,
        epoch: int,
        loss: float,
        lr: float,
        samples: int,
        tokens: int,
        step_seconds: float,
        data_wait_seconds: float,
    ) -> None:
        pass

    def on_checkpoint(self, *, duration_seconds: float, timestamp: float) -> None:
        pass

    def close(self) -> None:
        pass
