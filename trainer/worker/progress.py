"""Rank-0 progress output: a log line every N steps, a live bar when stdout is a terminal, and
the closing `done:` line."""

from __future__ import annotations

import sys
import time


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, enabled: bool, log_every: int) -> None:
        self.enabled = enabled
        self.log_every = log_every
        self.tty = enabled and sys.stdout.isatty()
        self.total = 0
        self.start_step = 0
        self.start = time.perf_counter()

    def begin(self, step: int, total_steps: int) -> None:
        """Training starts (or resumes) at `step`; rates and the ETA count from here."""
        self.start_step = step
        self.total = total_steps
        self.start = time.perf_counter()

    def log(self, text: str) -> None:
        if self.enabled:
            if self.tty:
                sys.stdout.write("\r\033[K")
            print(text, flush=True)

    def is_log_step(self, step: int) -> bool:
        """Steps whose line is logged with the loss averaged over all ranks (every rank asks)."""
        return step % self.log_every == 0

    def step(
        self,
        step: int,
        epoch: int,
        loss: float,
        lr: float,
        samples_per_s: float,
        tokens_per_s: float,
        step_ms: float,
    ) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        # Steps taken since begin(): after a resume the earlier steps took none of `elapsed`.
        eta = elapsed / max(1, step - self.start_step) * max(0, self.total - step)
        if self.is_log_step(step) or step == self.total:
            tok = f" | {tokens_per_s:,.0f} tok/s" if tokens_per_s else ""
            self.log(
                f"step {step}/{self.total} | epoch {epoch} | loss {loss:.4f} | lr {lr:.2e}"
                f" | {samples_per_s:,.0f} samples/s{tok} | {step_ms:.1f} ms/step"
                f" | eta {fmt_duration(eta)}"
            )
        elif self.tty:
            width = 30
            filled = int(width * step / max(1, self.total))
            sys.stdout.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {step}/{self.total} "
                f"loss {loss:.4f} eta {fmt_duration(eta)}"
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
        elapsed = time.perf_counter() - self.start
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
