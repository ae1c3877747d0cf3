"""Steps the host has launched but not read: what each one reports (the bucket it chose, the committed count after
it, its time) is copied to pinned memory behind it on the device and read once its end has passed, so that a loop of
steps never waits for a step it need not, and waits for the oldest one only when it is `max_in_flight` ahead.

Time points are CUDA events on the GPU (recorded, never waited for unless asked) and host clock readings on the CPU,
where every step is done by the time it returns.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class StepReport:
    """What a finished step reported."""

    drafted: bool  # False: an AR step without a draft
    chosen: int  # the chosen bucket's index (a drafted step's; 0 for an AR step)
    num_generated: int  # the committed count after the step
    seconds: float
    as_decoded: bool  # it ran as the decode's later steps will (replayed, where graphs are on): its time is a cost


@dataclass(slots=True)
class _Launched:
    start: object
    end: object
    drafted: bool
    slot: int
    as_decoded: bool


class InFlight:
    """The launched, unread steps of one decoder, oldest first, and the pinned slots their reports land in. Slots are
    reused every `ring` launches, when a step that old has long been read (ring > max_in_flight)."""

    def __init__(self, device: torch.device, max_in_flight: int, num_buckets: int) -> None:
        self.device, self.max_in_flight = device, max_in_flight
        self.ring = 2 * max_in_flight + 2
        pinned = device.type == "cuda"
        self._reports = torch.zeros(self.ring, 2, dtype=torch.int64, pin_memory=pinned)  # (chosen, num_generated)
        self._costs = torch.zeros(self.ring, num_buckets, pin_memory=pinned)
        self._limits = torch.zeros(self.ring, dtype=torch.int64, pin_memory=pinned)
        self._steps: deque[_Launched] = deque()
        self._num_launched = 0

    def __len__(self) -> int:
        return len(self._steps)

    def send_inputs(self, seconds: list[float], costs_to: torch.Tensor, limit: int, limit_to: torch.Tensor) -> None:
        """Copy the cost table and the tree's build limit into the device tensors the next drafted step reads,
        behind the work in flight."""
        slot = self._num_launched % self.ring
        self._costs[slot].copy_(torch.tensor(seconds))
        costs_to.copy_(self._costs[slot], non_blocking=True)
        self._limits[slot] = limit
        limit_to.copy_(self._limits[slot], non_blocking=True)

    def start(self):
        return self._mark()

    def finish(self, start, chosen: torch.Tensor | None, num_generated: torch.Tensor, as_decoded: bool) -> None:
        """The step launched since `start` is in flight: queue the copies of its report (chosen is None for an AR
        step) and its end, after them."""
        slot = self._num_launched % self.ring
        self._num_launched += 1
        report = self._reports[slot]
        if chosen is not None:
            report[0].copy_(chosen, non_blocking=True)
        report[1].copy_(num_generated, non_blocking=True)
        self._steps.append(_Launched(start, self._mark(), chosen is not None, slot, as_decoded))

    def read(self, wait_for: int = 0) -> list[StepReport]:
        """The reports of the launched steps that are done, oldest first, after waiting for the first wait_for."""
        out = []
        while self._steps:
            step = self._steps[0]
            if wait_for > 0:
                _wait(step.end)
            elif not _passed(step.end):
                break
            wait_for -= 1
            self._steps.popleft()
            chosen, num_generated = (int(x) for x in self._reports[step.slot])
            out.append(StepReport(step.drafted, chosen if step.drafted else 0, num_generated,
                                  max(_seconds(step.start, step.end), 1e-9), step.as_decoded))
        return out

    def _mark(self):
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event


def _passed(end) -> bool:
    """Whether a time point is past (a host clock reading always is)."""
    return not isinstance(end, torch.cuda.Event) or end.query()


def _wait(end) -> None:
    if isinstance(end, torch.cuda.Event):
        end.synchronize()


def _seconds(start, end) -> float:
    """Seconds between two time points (CUDA events, both past; or host clock readings)."""
    if isinstance(end, torch.cuda.Event):
        return start.elapsed_time(end) / 1e3
    return end - start
