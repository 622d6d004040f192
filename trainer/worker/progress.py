"""Rank-0 progress output: a log line every N steps, a live bar when stdout is a terminal, and
the closing `done:` line."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Rates on a log line count the steps since the previous line; the run's first step
    (torch.compile, CUDA and allocator warm-up) is timed on its own and kept out of them."""

    def __init__(
        self,
        enabled: bool,
        log_every: int,
        tokens_per_sample: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock = clock
        self.enabled = enabled
        self.log_every = log_every
        self.tokens_per_sample = tokens_per_sample
        self.tty = enabled and sys.stdout.isatty()
        self.total = 0
        self.begin(0, 0)

    def begin(self, step: int, total_steps: int) -> None:
        """Training starts (or resumes) at `step`; rates and the ETA count from here."""
        self.start_step = step
        self.total = total_steps
        self.start = self.clock()
        self.first_step_seconds: float | None = None  # begin() to the end of the first step
        self._eta_from = (self.start, step)  # after the first step: (time, step)
        self._window = (self.start, step)  # where the current log line's rates count from
        self._window_samples = 0
        self._loss: float | None = None  # the latest logged loss (the terminal bar shows it)

    def log(self, text: str) -> None:
        if self.enabled:
            if self.tty:
                sys.stdout.write("\r\033[K")
            print(text, flush=True)

    def is_log_step(self, step: int) -> bool:
        """Steps whose line is logged with the loss averaged over all ranks (every rank asks:
        reading the loss is collective)."""
        return step % self.log_every == 0 or step == self.total

    def step(self, step: int, epoch: int, lr: float, samples: int, loss: float | None) -> None:
        """Step `step` ended; `samples` counts every rank's; `loss` is given on log steps."""
        now = self.clock()
        self._window_samples += samples
        first = self.first_step_seconds is None
        if first:
            self.first_step_seconds = now - self.start
            self._eta_from = (now, step)
        if loss is not None:
            self._loss = loss
        if loss is not None and self.is_log_step(step):
            self._line(now, step, epoch, lr, loss)
        elif self.tty:
            self._bar(now, step)
        if first or loss is not None:
            self._window = (now, step)
            self._window_samples = 0

    def eta_seconds(self, step: int) -> float:
        """Seconds left after `step`, at the rate since the first step."""
        return self._eta(self.clock(), step)

    def _eta(self, now: float, step: int) -> float:
        since, from_step = self._eta_from
        if step > from_step:
            per_step = (now - since) / (step - from_step)
        else:  # only the first step so far
            per_step = (now - self.start) / max(1, step - self.start_step)
        return per_step * max(0, self.total - step)

    def _line(self, now: float, step: int, epoch: int, lr: float, loss: float) -> None:
        since, from_step = self._window
        seconds = max(now - since, 1e-9)
        steps = max(1, step - from_step)
        sps = self._window_samples / seconds
        tok = f" | {sps * self.tokens_per_sample:,.0f} tok/s" if self.tokens_per_sample else ""
        self.log(
            f"step {step}/{self.total} | epoch {epoch} | loss {loss:.4f} | lr {lr:.2e}"
            f" | {sps:,.0f} samples/s{tok} | {seconds / steps * 1000:.1f} ms/step"
            f" | eta {fmt_duration(self._eta(now, step))}"
        )

    def _bar(self, now: float, step: int) -> None:
        width = 30
        filled = int(width * step / max(1, self.total))
        loss = f"loss {self._loss:.4f} " if self._loss is not None else ""
        sys.stdout.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {step}/{self.total} "
            f"{loss}eta {fmt_duration(self._eta(now, step))}"
        )
        sys.stdout.flush()

    def done(
        self,
        step: int,
        loss: float,
        first_loss: float | None,
        val_loss: float | None,
        samples_per_step: int,
        tokens_per_sample: int,
    ) -> None:
        """The closing line: steps, time, losses and throughput of this run."""
        elapsed = self.clock() - self.start
        steps = step - self.start_step
        sps = steps * samples_per_step / elapsed if elapsed > 0 else 0.0
        tok = f" | {sps * tokens_per_sample:,.0f} tok/s" if tokens_per_sample else ""
        val = f" | val loss {val_loss:.4f}" if val_loss is not None else ""
        start = first_loss if first_loss is not None else float("nan")
        self.log(
            f"done: {step} steps in {fmt_duration(elapsed)} ({elapsed:.1f}s) | final loss "
            f"{loss:.4f} (start {start:.4f}){val} | {sps:,.0f} samples/s{tok} | "
            f"{elapsed / max(1, steps) * 1000:.1f} ms/step"
        )
