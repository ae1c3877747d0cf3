"""The training progress line on stderr: one line redrawn in place on a terminal, a plain line per logged
interval otherwise (logs, CI)."""
from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s / 1e6:.2f}M" if tokens_per_s >= 1e6 else f"{tokens_per_s / 1e3:.1f}k"


class Progress:
    """update() at each logged interval: step, a bar, tokens/s, train (and validation) loss, ETA."""

    BAR_WIDTH = 24

    def __init__(self, total_steps: int, start_step: int, stream: TextIO | None = None) -> None:
        self.total, self.start_step = total_steps, start_step
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.perf_counter()

    def update(self, step: int, tokens_per_s: float, train_loss: float, val_loss: float | None = None) -> None:
        done = step / self.total
        elapsed = time.perf_counter() - self.started
        per_step = elapsed / max(step - self.start_step, 1)
        filled = int(done * self.BAR_WIDTH)
        bar = "=" * filled + (">" if filled < self.BAR_WIDTH else "") + " " * (self.BAR_WIDTH - filled - 1)
        val = f" | val {val_loss:.3f}" if val_loss is not None else ""
        line = (f"step {step}/{self.total} [{bar}] {done:4.0%} | {_rate(tokens_per_s)} tok/s | loss {train_loss:.3f}"
                f"{val} | ETA {_duration(per_step * (self.total - step))}")
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
