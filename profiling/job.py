"""A measurement that runs in a background thread and can be stopped between decode steps, so a page can show its
progress, an estimate of the time left and a Stop button while it runs (the dashboard's Profile page).

The work is a function of the Job: it calls job.step(tokens) after every decode step (which raises Stopped once
stop() was asked for) and job.units_done(n) as units of work (decodes) complete; the job's progress is the share
of the planned tokens done so far, and the time left is extrapolated from it. Nothing here touches Streamlit.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


class Stopped(Exception):
    """The job was asked to stop: the work ends at its next step."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a job will do: `units` decodes of `tokens_per_unit` tokens each, named `unit` ("repeat", "decode")."""

    units: int
    tokens_per_unit: int
    unit: str

    def __post_init__(self) -> None:
        if self.units < 1 or self.tokens_per_unit < 1:
            raise ValueError(f"a job plans at least one decode of one token, not {self.units} x {self.tokens_per_unit}")

    @property
    def tokens(self) -> int:
        return self.units * self.tokens_per_unit


class Job:
    """`work(job)` in a daemon thread; its result, its error (an exception other than Stopped) or that it stopped."""

    def __init__(self, name: str, plan: Plan, work: Callable[[Job], object]) -> None:
        self.name, self.plan, self._work = name, plan, work
        self._stop = threading.Event()
        self.result: object | None = None
        self.error: BaseException | None = None
        self.stopped = False
        self.units = 0  # planned decodes done
        self.tokens_done = 0
        self.started = time.monotonic()
        self.ended: float | None = None
        self._thread = threading.Thread(target=self._run, name=f"ddtree-{name}", daemon=True)

    def start(self) -> Job:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.result = self._work(self)
        except Stopped:
            self.stopped = True
        except Exception as exc:  # noqa: BLE001 - handed to the page, which shows it
            self.error = exc
        finally:
            self.ended = time.monotonic()

    # -- called by the work, in the job's thread
    def step(self, tokens: int) -> None:
        """A decode step committed `tokens` tokens; raises Stopped when a stop was asked for."""
        self.tokens_done = min(self.plan.tokens, self.tokens_done + tokens)
        if self._stop.is_set():
            raise Stopped

    def units_done(self, count: int) -> None:
        """`count` planned decodes are done: the progress is set to exactly their tokens (a step may commit past a
        decode's last token, so the step counts drift between two calls)."""
        self.units = min(count, self.plan.units)
        self.tokens_done = self.units * self.plan.tokens_per_unit
        if self._stop.is_set():
            raise Stopped
        if self._stop.is_set():
            raise Stopped

    # -- called by the page
    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set() and self.running

    @property
    def running(self) -> bool:
        return self.ended is None

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the work to end; whether it has."""
        self._thread.join(timeout)
        return not self.running

    @property
    def fraction(self) -> float:
        return self.tokens_done / self.plan.tokens

    @property
    def elapsed_s(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    @property
    def left_s(self) -> float | None:
        """The time left at the pace so far (None before the first token)."""
        f = self.fraction
        return self.elapsed_s * (1 - f) / f if f > 0 else None
