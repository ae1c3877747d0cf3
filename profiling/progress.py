"""A plain-text progress bar on stderr for decodes (no dependency): one line per run, redrawn in place on a
terminal; elsewhere (a log file, a pipe) only each run's final line is written."""
from __future__ import annotations

import sys
from typing import TextIO

from engine.records import StepRecord


class DecodeProgress:
    """on_step callback for decode_pair: tokens generated so far out of max_new_tokens, per run mode."""

    def __init__(self, total_tokens: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.total = total_tokens
        self.stream = stream if stream is not None else sys.stderr  # looked up now: sys.stderr may be swapped
        self.width = width
        self.mode: str | None = None
        self.done = 0
        self.num_steps = 0

    def __call__(self, step: StepRecord) -> None:
        if step.mode != self.mode:
            self.finish()
            self.mode, self.done, self.num_steps = step.mode, 1, 0  # the prefill's token
        self.done = min(self.total, self.done + step.num_committed)
        self.num_steps += 1
        if self.stream.isatty():
            self.draw()

    def draw(self) -> None:
        filled = round(self.width * self.done / self.total) if self.total else self.width
        bar = "#" * filled + "-" * (self.width - filled)
        start = "\r" if self.stream.isatty() else ""
        self.stream.write(f"{start}{self.mode:<6} [{bar}] {self.done}/{self.total} tokens, {self.num_steps} steps")
        self.stream.flush()

    def finish(self) -> None:
        """End the current line (call once more after the last run)."""
        if self.mode is not None:
            if not self.stream.isatty():
                self.draw()
            self.stream.write("\n")
            self.stream.flush()
            self.mode = None
