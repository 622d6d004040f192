"""Curves where ML users look: TensorBoard scalars, written by global rank 0.

Tags: `train/loss` (the logged loss: the mean over the ranks and the log interval),
`train/learning_rate`, `train/samples_per_second` (the job's, over the interval; a worker
group's first step, its warm-up, left out), `train/step_seconds` (the mean over the interval)
and `eval/loss`; a user's program adds its `report_step(metrics=...)` numbers under their names.
Written with PyTorch's documented writer, torch.utils.tensorboard.SummaryWriter, which needs the
`tensorboard` package (the extra `kubeddp[tensorboard]`); without it, one line at start.

Where (metrics.tensorboard): `auto` is beside the checkpoints, `<checkpoint.dir>/tensorboard`
(`tensorboard --logdir <checkpoint.dir>` shows the run); `off`; or a directory or `s3://` URL.
A directory (a claim's mount too) is written directly. For an object store the event files are
written in a scratch directory and uploaded whole (objects have no append) with the checkpoint
backend's client, in the background: after each checkpoint save, at least every
UPLOAD_SECONDS, and at the end.

Resumes: each worker generation writes an event file of its own that starts with TensorBoard's
purge marker at its first step (SummaryWriter's `purge_step`). A reader drops the earlier files'
points from that step on (TensorBoard's Python loader at the marker, its Rust data server as each
tag's first new point arrives), so a step run again after a resume is shown once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubeddp.trainer import constants, storage_rules
from kubeddp.trainer.storage_rules import TENSORBOARD_DIR

FLUSH_SECONDS = 10  # the writer's own flush: what a live TensorBoard sees lags by at most this
UPLOAD_SECONDS = 60  # an object store gets the event files at least this often
# A user program's report_step has a loss every step: it writes at most ten points a second,
# each the mean of its interval (the built-in trainer writes one at each log step).
REPORT_POINT_SECONDS = 0.1
# report_step(metrics=...) names that are the built-in trainer's tags
SAME_AS_TRAINER = {"eval_loss": "eval/loss", "lr": "train/learning_rate",
                   "learning_rate": "train/learning_rate"}  # fmt: skip


def resolve_target(setting: str, checkpoint_dir: str) -> str:
    """Where the curves go ('' for nowhere): metrics.tensorboard against checkpoint.dir."""
    if setting == "off":
        return ""
    if setting != "auto":
        return setting
    if not checkpoint_dir.strip():  # refused as a checkpoint directory too: never `/tensorboard`
        return ""
    return f"{checkpoint_dir.rstrip('/')}/{TENSORBOARD_DIR}"


def installed() -> bool:
    """Whether the `tensorboard` package can be imported (looked up, not imported: ~0.3 CPU-s)."""
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # a package shadowed or blocked in sys.modules
        return False


class _Interval:
    """What happened since the last point: steps, samples, seconds, losses."""

    def __init__(self) -> None:
        self.steps, self.samples, self.seconds = 0, 0, 0.0
        self.losses: list[float] = []

    def add(self, samples: int, seconds: float | None, loss: float | None) -> None:
        if seconds is not None:
            self.steps += 1
            self.samples += samples
            self.seconds += seconds
        if loss is not None:
            self.losses.append(loss)


class Curves:
    """Rank 0's TensorBoard writer; every other rank, and every rank without the package, has
    one that does nothing."""

    def __init__(
        self,
        setting: str,
        checkpoint_dir: str,
        is_main: bool,
        log: Callable[[str], None],
        min_point_seconds: float = 0.0,
    ) -> None:
        self.log = log
        self.min_point_seconds = min_point_seconds  # report_step's: it has a loss every step
        self.target = resolve_target(setting, checkpoint_dir) if is_main else ""
        self.enabled = bool(self.target)
        if self.enabled and not installed():
            log(
                "[kubeddp] TensorBoard curves off: the tensorboard package is not installed "
                "(pip install 'kubeddp[tensorboard]', or set metrics.tensorboard=off)"
            )
            self.enabled = False
        self.writer: Any = None
        self.directory: Path | None = None  # where the event files are written
        self._store: Any = None  # the object store they are uploaded to, if any
        self._upload: threading.Thread | None = None
        self._upload_error: BaseException | None = None
        self._interval = _Interval()
        self._pending: tuple[int, float | None, dict[str, float]] | None = None  # last step's
        self._warm_up = True  # the generation's first step: its time is not a step's speed
        self._next_point = 0.0
        self._next_upload = 0.0

    # ---- what the loop (or report_step) tells it -----------------------------------------
    def on_step(
        self,
        step: int,
        *,
        loss: float | None,
        lr: float | None,
        samples: int,
        step_seconds: float | None,
        extra: Mapping[str, float] | None = None,
    ) -> None:
        """Step `step` ended; `samples` counts every rank's. A point is written when there is
        a loss (the trainer's log steps), at most every `min_point_seconds`."""
        if not self.enabled:
            return
        if self.writer is None and not self._open(step):
            return
        if self._warm_up:
            self._warm_up, step_seconds = False, None
        self._interval.add(samples, step_seconds, loss)
        self._pending = (step, lr, dict(extra or {}))
        now = time.monotonic()
        if loss is None or now < self._next_point:
            return
        self._next_point = now + self.min_point_seconds
        if self._store is not None and now >= self._next_upload:
            self.on_checkpoint()
        self._point()

    def _point(self) -> None:
        """The interval's point, at its last step."""
        if self._pending is None or not self._interval.losses:
            return
        (step, lr, extra), span = self._pending, self._interval
        self._pending, self._interval = None, _Interval()
        points = {"train/loss": sum(span.losses) / len(span.losses)}
        if lr is not None:
            points["train/learning_rate"] = lr
        if span.seconds > 0:
            points["train/samples_per_second"] = span.samples / span.seconds
            points["train/step_seconds"] = span.seconds / span.steps
        for name, value in extra.items():
            points[SAME_AS_TRAINER.get(name, name)] = value
        self._write(step, points)

    def on_eval(self, step: int, loss: float | None) -> None:
        if self.enabled and loss is not None and (self.writer is not None or self._open(step)):
            self._write(step, {"eval/loss": loss})

    def on_checkpoint(self) -> None:
        """A checkpoint was saved: what led up to it goes to disk (and to the store)."""
        if self.writer is None:
            return
        self._guarded(self.writer.flush)
        self._upload_failed()
        if self._store is not None and (self._upload is None or not self._upload.is_alive()):
            self._next_upload = time.monotonic() + UPLOAD_SECONDS
            self._upload = threading.Thread(target=self._send_in_background,
                                            name="kubeddp-curves", daemon=True)  # fmt: skip
            self._upload.start()

    def close(self) -> None:
        if self.writer is None:
            return
        self._point()  # what the last interval had (report_step's points are spaced in time)
        self._guarded(self.writer.close)
        if self._upload is not None:
            self._upload.join()
        self._upload_failed()
        if self._store is not None:
            self._guarded(self._send)
        self.writer = None
        self.enabled = False

    # ---- the writer --------------------------------------------------------------------------
    def _open(self, first_step: int) -> bool:
        """The writer of this generation, from its first step: its file's purge marker hides
        what earlier generations wrote from that step on."""
        try:
            from torch.utils.tensorboard import SummaryWriter  # the tensorboard extra: optional

            if storage_rules.is_directory(self.target):
                self.directory = Path(self.target)
            else:
                from kubeddp.trainer.worker.checkpoint.backends import storage_for

                self._store = storage_for(self.target)
                self.directory = Path(
                    tempfile.mkdtemp(prefix="kubeddp-tensorboard-", dir=constants.SCRATCH_DIR)
                )
            self.writer = SummaryWriter(
                str(self.directory), purge_step=first_step, flush_secs=FLUSH_SECONDS
            )
        except Exception as exc:  # noqa: BLE001 - curves are never worth the run
            self._off(exc)
            return False
        return True

    def _write(self, step: int, points: Mapping[str, float]) -> None:
        def add() -> None:
            for tag, value in points.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(tag, float(value), step)

        self._guarded(add)

    def _send_in_background(self) -> None:
        try:
            self._send()
        except Exception as exc:  # noqa: BLE001 - reported by the training thread
            self._upload_error = exc

    def _upload_failed(self) -> None:
        if self._upload_error is not None:
            self._off(self._upload_error)

    def _send(self) -> None:
        """Every event file of this generation to the store, whole (objects have no append)."""
        assert self.directory is not None
        for path in sorted(self.directory.glob("events.out.tfevents.*")):
            self._store.write_note(path.name, path.read_bytes())

    def _guarded(self, action: Callable[[], Any]) -> None:
        if not self.enabled:
            return
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - curves are never worth the run
            self._off(exc)

    def _off(self, exc: BaseException) -> None:
        self.enabled = False
        self.log(
            f"[kubeddp] warning: TensorBoard curves off: cannot write to {self.target} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "training goes on"
        )
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
            self.writer = None
