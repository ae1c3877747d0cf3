"""Timed ranges laid out on a run's timeline, properly nested: what the trace and the timeline figure draw.

A step's ranges come from the record's spans (start offsets the timer measured) when it has them; from
timings_ns alone they are rebuilt by packing each range's children one after another from its start, in
the order they ran (true order and durations, idealised gaps). Steps follow the prefill back to back, each
in a slot of its host wall time (StepRecord.wall_ns), so the gaps between the "step" ranges are the
host's bookkeeping (reading the record back) and nothing is hidden.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.records import RunRecord, StepRecord
from engine.timers import Span
from profiling.metrics import STEP, range_parents, tree_order

PREFILL = "prefill"


@dataclass(slots=True, frozen=True)
class TimedSpan:
    """A range on the run's timeline (ns since the prefill started); step is None for the prefill."""

    name: str
    start_ns: int
    dur_ns: int
    depth: int
    step: int | None

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


def packed_spans(timings_ns: dict[str, int]) -> list[Span]:
    """Spans rebuilt from per-name totals: each range's children packed from its start, clipped to it."""
    names = tree_order(list(timings_ns))
    parents = range_parents(names)
    start: dict[str, int] = {}
    cursor: dict[str, int] = {}  # per parent: where its next child starts
    spans = []
    for name in names:
        parent = parents[name]
        begin = 0 if parent is None else cursor[parent]
        limit = None if parent is None else start[parent] + timings_ns[parent]
        dur = timings_ns[name] if limit is None else max(0, min(timings_ns[name], limit - begin))
        start[name] = cursor[name] = begin
        if parent is not None:
            cursor[parent] = begin + dur
        spans.append(Span(name, begin, dur))
    return spans


def nested(spans: list[Span]) -> list[tuple[Span, int]]:
    """Spans in open order with their nesting depth, each clipped into its enclosing span (CUDA event
    times are rounded, so a child may overhang its parent by a few ns)."""
    out: list[tuple[Span, int]] = []
    stack: list[Span] = []
    for span in spans:
        while stack and not span.name.startswith(stack[-1].name + "/"):
            stack.pop()
        begin, end = span.start_ns, span.start_ns + span.dur_ns
        if stack:
            outer = stack[-1]
            begin = min(max(begin, outer.start_ns), outer.start_ns + outer.dur_ns)
            end = min(max(end, begin), outer.start_ns + outer.dur_ns)
        clipped = Span(span.name, begin, end - begin)
        out.append((clipped, len(stack)))
        stack.append(clipped)
    return out


def step_spans(step: StepRecord) -> list[Span]:
    """The step's ranges with offsets from the step's start, parents before children."""
    recorded = getattr(step, "spans", None)  # StepRecord.spans: the timer's measured offsets, when recorded
    if recorded:
        return [Span(*s) for s in recorded]
    if step.timings_ns:
        return packed_spans(step.timings_ns)
    return [Span(STEP, 0, step.wall_ns)]


def step_slots(run: RunRecord) -> list[tuple[int, int]]:
    """(start, length) of each step on the run's timeline, ns since the prefill started."""
    slots = []
    at = run.prefill_ns
    for step in run.steps:
        extent = max((s.start_ns + s.dur_ns for s in step_spans(step)), default=0)
        length = max(step.wall_ns, extent)
        slots.append((at, length))
        at += length
    return slots


def run_spans(run: RunRecord) -> list[TimedSpan]:
    """The prefill, then every step's ranges, on one timeline."""
    out = [TimedSpan(PREFILL, 0, run.prefill_ns, 0, None)]
    for step, (at, _) in zip(run.steps, step_slots(run), strict=True):
        for span, depth in nested(step_spans(step)):
            out.append(TimedSpan(span.name, at + span.start_ns, span.dur_ns, depth, step.index))
    return out
