"""Rank-0 progress output: a log line every N steps, a live bar when stdout is a terminal."""

from __future__ import annotations

import sys
import time


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, enabled: bool, total_steps: int, log_every: int) -> None:
        self.enabled = enabled
        self.total = total_steps
        self.log_every = log_every
        self.tty = enabled and sys.stdout.isatty()
        self.start = time.perf_counter()

    def log(self, text: str) -> None:
        if self.enabled:
            if self.tty:
                sys.stdout.write("\r\033[K")
            print(text, flush=True)

    def step(
        self,
        step: int,
        epoch: int,
        loss: float,
        lr: float,
        samples_per_s: float,
        tokens_per_s: float,
        step_ms: float,
        done_steps: int,
    ) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        eta = elapsed / max(1, done_steps) * max(0, self.total - step)
        if step % self.log_every == 0 or step == self.total:
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
