"""What your own training script may call when it runs under kubeddp (`--script`/`--module`).

    try:
        from kubeddp import api as kubeddp_api
    except ImportError:  # the same script still runs under a plain torchrun
        kubeddp_api = None

- `report_step(step, samples, loss=None, tokens=None, *, total_steps=None, epoch=None,
  total_epochs=None, metrics=None)`: once per optimizer step on every rank; feeds the pod's
  /metrics like the built-in trainer (kubeddp_step, kubeddp_samples_total,
  kubeddp_tokens_total, kubeddp_loss, kubeddp_epoch, kubeddp_step_duration_seconds: the
  time between two calls). A no-op where `kubeddp launch` serves no metrics. On a TrainJob
  whose controller offers Kubeflow Trainer's status endpoint, rank 0's calls also fill the
  TrainJob's status.trainerStatus: step, total_steps (percentage, remaining time), epochs,
  loss and `metrics` ({name: number or short string}, e.g. eval_loss).
- `stop_requested()`: True once SIGTERM reached this worker (preemption, node drain, `docker
  stop`); save a snapshot and `sys.exit(EXIT_PREEMPTED)`. A program that polls it gets
  `checkpoint.preempt_grace_seconds`; one that never does is ended at once on SIGTERM.
- `EXIT_PREEMPTED` (143): the retryable exit code the launcher and operators read as
  "preempted, resume from the checkpoint".

Importing this module has no side effects and imports neither torch nor prometheus_client.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import time
from typing import Any

from kubeddp.trainer import process_contract
from kubeddp.trainer.exit_codes import PREEMPTED as EXIT_PREEMPTED
from kubeddp.trainer.worker import stop_signal

__all__ = ["EXIT_PREEMPTED", "report_step", "stop_requested"]


def stop_requested() -> bool:
    """True once SIGTERM reached this process: save, then `sys.exit(EXIT_PREEMPTED)`."""
    return stop_signal.requested()


class _StepReporter:
    """This process's TrainingMetrics and TensorBoard curves (made at the first report), and
    the time of the last report, from which each step's duration comes."""

    def __init__(self) -> None:
        self.metrics: Any = None
        self.enabled: bool | None = None  # None: not decided yet
        self.last_report: float | None = None
        self.curves: Any = None

    def draw(self, step: int, samples: int, loss: float | None, seconds: float | None,
             numbers: dict[str, float]) -> None:  # fmt: skip
        """Rank 0's TensorBoard points (worker/curves.py); the first call decides where."""
        if self.curves is None:
            self.curves = _curves()
            atexit.register(self.curves.close)
        self.curves.on_step(step, loss=loss, lr=None, samples=samples * _world_size(),
                            step_seconds=seconds, extra=numbers)  # fmt: skip

    def start(self) -> bool:
        if self.enabled is None:
            self.enabled = bool(os.environ.get(process_contract.ENV_PROMETHEUS_MULTIPROC_DIR))
            if self.enabled:
                self.metrics = _training_metrics()
                self.enabled = self.metrics.enabled
                atexit.register(self.metrics.close)  # the last buffered values reach /metrics
        return self.enabled

    def report(self, step: int, samples: int, loss: float | None, tokens: int | None,
               progress: dict[str, Any], numbers: dict[str, float]) -> None:  # fmt: skip
        now = time.monotonic()
        previous, self.last_report = self.last_report, now
        seconds = now - previous if previous is not None else None
        _heartbeat(int(step), loss)
        _status(step, loss, progress)
        self.draw(int(step), int(samples), loss, seconds, numbers)
        if not self.start():
            return
        self.metrics.on_step(
            step=int(step),
            epoch=progress["epoch"],
            loss=None if loss is None else float(loss),
            lr=None,
            samples=int(samples),
            tokens=int(tokens or 0),
            step_seconds=seconds,
            data_wait_seconds=0.0,
        )


class _StatusFeed:
    """Rank 0's feed of the TrainJob's status (worker/status_feed.py), made at the first
    report where `kubeddp launch` posts progress; None everywhere else."""

    feed: Any = None
    decided = False

    @classmethod
    def get(cls) -> Any:
        if not cls.decided:
            cls.decided = True
            if os.environ.get(process_contract.ENV_STATUS_FILE):
                from kubeddp.trainer.worker import status_feed

                cls.feed = status_feed.for_rank(_global_rank())
                if cls.feed is not None:
                    atexit.register(cls.feed.flush)  # the last step reaches the status
        return cls.feed


def _global_rank() -> int:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _world_size() -> int:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _curves() -> Any:
    """Rank 0's TensorBoard curves where the config launch resolved says (metrics.tensorboard);
    none for a program kubeddp launch did not start."""
    from kubeddp.trainer.config import ConfigError
    from kubeddp.trainer.process_contract import resolved_config
    from kubeddp.trainer.worker.curves import REPORT_POINT_SECONDS, Curves

    try:
        cfg = resolved_config(os.environ)
    except ConfigError:
        cfg = None
    if cfg is None:
        return Curves("off", "", False, print)
    return Curves(cfg.metrics.tensorboard, cfg.checkpoint.dir, _global_rank() == 0, _say,
                  REPORT_POINT_SECONDS)  # fmt: skip


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _numbers(metrics: object) -> dict[str, float]:
    """The numbers among report_step's `metrics` (checked by _checked_metrics already)."""
    out = {}
    for name, value in (metrics or {}).items():  # type: ignore[attr-defined]
        if hasattr(value, "item") and not isinstance(value, (int, float, str)):
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def _status(step: int, loss: float | None, progress: dict[str, Any]) -> None:
    feed = _StatusFeed.get()
    if feed is not None:
        feed.update(step, loss=loss, **progress)


def _heartbeat(step: int, loss: float | None) -> None:
    """This rank's progress record (the stall watch reads it), and the divergence guard."""
    from kubeddp.trainer.process_contract import PHASE_CODE
    from kubeddp.trainer.worker import program_watch
    from kubeddp.trainer.worker.heartbeat import this_rank

    program_watch.reported()
    hb = this_rank()
    hb.step_done(step, PHASE_CODE["step"])
    if loss is not None and not math.isfinite(loss):
        _nonfinite(hb, step, loss)


def _nonfinite(hb: Any, step: int, loss: float) -> None:
    """diagnostics.on_nonfinite for a program: `skip` only says so (the program's step is
    done); `stop` and `keep_last_good` end it with NONFINITE (its checkpoints are its own)."""
    from kubeddp.trainer import exit_codes
    from kubeddp.trainer.config import ConfigError
    from kubeddp.trainer.process_contract import resolved_config

    hb.nonfinite(step, "loss")
    rank = os.environ.get("RANK", "0")
    try:
        cfg = resolved_config(os.environ)
    except ConfigError:
        return  # not started by kubeddp launch: no guard is configured (the record keeps it)
    action = cfg.diagnostics.on_nonfinite
    line = f"[kubeddp] non-finite loss ({loss}) at step {step} on rank {rank}"
    if action == "skip":
        print(f"{line} (diagnostics.on_nonfinite=skip)", file=sys.stderr, flush=True)
        return
    print(
        f"{line}: stopping (diagnostics.on_nonfinite={action}); exit code "
        f"{exit_codes.describe(exit_codes.NONFINITE)}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(exit_codes.NONFINITE)


def _training_metrics() -> Any:
    from kubeddp.trainer.config import MetricsConfig
    from kubeddp.trainer.worker.metrics import TrainingMetrics

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    backend, device = "none", None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
        world_size = dist.get_world_size()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.device("cuda", torch.cuda.current_device())
    return TrainingMetrics(MetricsConfig(), rank, world_size, backend, device=device)


_REPORTER = _StepReporter()


_warned = False


def _warn_once(message: str) -> None:
    """A bad call is the program's business, not a reason to end it: said once, then ignored
    (under a plain torchrun, without kubeddp, the same call would do nothing at all)."""
    global _warned
    if not _warned:
        _warned = True
        print(f"[kubeddp] warning: {message}; this and later bad calls are ignored (metrics "
              "only)", file=sys.stderr, flush=True)  # fmt: skip


def _count(value: object, name: str) -> int:
    """A whole number >= 0 (a 0-d tensor or numpy integer too), else ValueError."""
    if hasattr(value, "item") and not isinstance(value, int):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} is not a whole number")
    if value < 0:
        raise ValueError(f"{name}={value} is negative")
    return value


def _optional_count(value: object, name: str) -> int | None:
    return None if value is None else _count(value, name)


def _checked_metrics(metrics: object) -> dict[str, str]:
    """{name: value} with each value formatted as Trainer keeps it (a string of at most 64
    characters; a number with 6 significant digits)."""
    from kubeddp.trainer.process_contract import check_name, format_value

    if metrics is None:
        return {}
    if not isinstance(metrics, dict):
        raise ValueError(f"metrics={metrics!r} is not a dict of name: value")
    return {check_name(name): format_value(value) for name, value in metrics.items()}


def _progress(total_steps: object, epoch: object, total_epochs: object, metrics: object) -> dict:
    """report_step's keyword arguments, checked."""
    return {
        "total_steps": _optional_count(total_steps, "total_steps"),
        "epoch": _optional_count(epoch, "epoch"),
        "total_epochs": _optional_count(total_epochs, "total_epochs"),
        "metrics": _checked_metrics(metrics),
    }


def _checked(step: object, samples: object, loss: object, tokens: object) -> tuple:
    if loss is not None:
        if hasattr(loss, "item"):
            loss = loss.item()  # a tensor: one sync, as `print(loss.item())` would
        if isinstance(loss, bool) or not isinstance(loss, (int, float)):
            raise ValueError(f"loss={loss!r} is not a number")
        loss = float(loss)  # nan and inf are kept: a diverging loss is worth seeing
    return (
        _count(step, "step"),
        _count(samples, "samples"),
        loss,
        None if tokens is None else _count(tokens, "tokens"),
    )


def report_step(
    step: int,
    samples: int,
    loss: float | None = None,
    tokens: int | None = None,
    *,
    total_steps: int | None = None,
    epoch: int | None = None,
    total_epochs: int | None = None,
    metrics: dict[str, float | int | str] | None = None,
) -> None:
    """Record one optimizer step of this rank: the global step number, the samples (and
    tokens) this rank processed in it, and its loss. Call it on every rank, every step.

    On a TrainJob that offers Kubeflow Trainer's status endpoint, rank 0's calls also make its
    status: `total_steps` gives the percentage and the remaining time, `epoch` (from 0) and
    `total_epochs` are shown as they are, and `metrics` adds {name: value} pairs (names and
    values of at most 64 characters; numbers or strings), e.g. {"eval_loss": 0.41}.

    It never ends the program: a bad argument, or metrics that cannot be written, is one
    warning on stderr, and the step goes unrecorded."""
    try:
        checked = (
            *_checked(step, samples, loss, tokens),
            _progress(total_steps, epoch, total_epochs, metrics),
            _numbers(metrics),
        )
    except (ValueError, TypeError, OverflowError) as exc:
        _warn_once(f"kubeddp.api.report_step ignored: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - a loss.item() that failed, say
        _warn_once(f"kubeddp.api.report_step ignored: {type(exc).__name__}: {exc}")
        return
    try:
        _REPORTER.report(*checked)
    except Exception as exc:  # noqa: BLE001 - metrics are never worth the user's run
        _warn_once(f"kubeddp.api.report_step could not record step {checked[0]} "
                   f"({type(exc).__name__}: {exc})")  # fmt: skip


def _flush() -> None:
    """Write what is buffered (the runner calls this before a forced exit)."""
    if _REPORTER.metrics is not None:
        _REPORTER.metrics.flush()
    if _StatusFeed.feed is not None:
        _StatusFeed.feed.flush()
    if _REPORTER.curves is not None:
        _REPORTER.curves.close()
