"""StepTimer: nested names, per-name totals, spans with start offsets, profiler annotation, disabled timers."""
from __future__ import annotations

import random
import time

import pytest
import torch

from engine import timers
from engine.timers import Span, StepTimer, stage_category
from profiling.spans import nested


def run_random_ranges(timer: StepTimer, rng: random.Random, depth: int, prefix: list[str]) -> list[str]:
    """Open a random tree of ranges (sibling names distinct); returns the full names in open order."""
    opened = []
    for i in range(rng.randint(1, 3)):
        name = f"r{i}"
        full = "/".join([*prefix, name])
        with timer.range(name):
            opened.append(full)
            time.sleep(rng.uniform(0, 2e-4))
            if depth > 0 and rng.random() < 0.6:
                opened += run_random_ranges(timer, rng, depth - 1, [*prefix, name])
    return opened


@pytest.fixture
def random_step() -> tuple[StepTimer, list[str]]:
    """A CPU timer after one step of randomly nested ranges, and the range names in the order they opened."""
    timer = StepTimer("cpu")
    with timer.range("step"):
        opened = ["step"] + run_random_ranges(timer, random.Random(), 3, ["step"])
    return timer, opened


def test_names_nest_and_parents_cover_children(random_step):
    timer, opened = random_step
    res = timer.results_ns()
    assert set(res) == set(opened)
    for name, ns in res.items():
        children = [c for c in res if c.rsplit("/", 1)[0] == name and c != name]
        assert ns >= sum(res[c] for c in children), name


def test_spans_are_in_open_order_nested_and_match_totals(random_step):
    timer, opened = random_step
    res = timer.results_ns()
    spans = timer.last_spans()
    assert [s.name for s in spans] == opened
    assert spans[0].start_ns == 0 and spans[0].dur_ns == res["step"]
    assert {s.name: s.dur_ns for s in spans} == res  # names are unique here
    for span, depth in nested(spans):  # clipping changes nothing: the measured spans already nest
        assert span in spans
        assert depth == span.name.count("/")
    starts = [s.start_ns for s in spans]
    assert starts == sorted(starts)


def test_repeated_names_add_up_and_results_reset():
    timer = StepTimer("cpu")
    with timer.range("step"):
        for _ in range(3):
            with timer.range("x"):
                time.sleep(1e-4)
    res = timer.results_ns()
    spans = timer.last_spans()
    xs = [s for s in spans if s.name == "step/x"]
    assert len(xs) == 3 and res["step/x"] == sum(s.dur_ns for s in xs)
    assert res["step/x"] >= 3 * 100_000
    assert timer.results_ns() == {} and timer.last_spans() == []


def test_sleep_is_measured():
    seconds = random.uniform(0.002, 0.01)
    timer = StepTimer("cpu")
    with timer.range("step"):
        time.sleep(seconds)
    ns = timer.results_ns()["step"]
    assert seconds * 1e9 <= ns < seconds * 1e9 + 50e6


def test_exception_inside_a_range_keeps_the_stack_consistent():
    timer = StepTimer("cpu")
    with pytest.raises(RuntimeError, match="boom"), timer.range("step"), timer.range("bad"):
        raise RuntimeError("boom")
    with timer.range("after"):
        pass
    assert set(timer.results_ns()) == {"step", "step/bad", "after"}


def test_disabled_timer_records_nothing_and_runs_the_body():
    timer = StepTimer("cpu", enabled=False)
    ran = []
    with timer.range("step"), timer.range("inner"):
        ran.append(True)
    assert ran == [True]
    assert timer.results_ns() == {} and timer.last_spans() == []


def test_annotate_puts_our_names_in_a_torch_profiler_capture():
    timer = StepTimer("cpu", annotate=True)
    x = torch.randn(32, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with timer.range("step"), timer.range("verify"):
            x @ x
    names = {e.name() for e in prof.profiler.kineto_results.events()}
    assert {"step", "step/verify"} <= names
    assert set(timer.results_ns()) == {"step", "step/verify"}


def test_stage_category():
    assert stage_category("step") == "step"
    assert stage_category("step/verify/layer3/attn/verify_attn") == "verify"
    assert stage_category("step/draft") == "draft"


def test_nested_clips_an_overhanging_child():
    spans = [Span("step", 0, 100), Span("step/a", 10, 50), Span("step/a/b", 40, 30), Span("step/c", 90, 20)]
    out = nested(spans)
    assert [d for _, d in out] == [0, 1, 2, 1]
    assert out[2][0] == Span("step/a/b", 40, 20)  # clipped to end with step/a at 60
    assert out[3][0] == Span("step/c", 90, 10)


def test_ranges_push_and_pop_nvtx_with_full_names(monkeypatch):
    events = []
    monkeypatch.setattr(timers, "_NVTX", (lambda name: events.append(("push", name)), lambda: events.append("pop")))
    timer = StepTimer("cpu")
    with timer.range("step"):
        with timer.range("verify"), timer.range("layer0/attn"):
            pass
        with pytest.raises(ValueError), timer.range("tree_accept"):
            raise ValueError
    assert events == [("push", "step"), ("push", "step/verify"), ("push", "step/verify/layer0/attn"), "pop", "pop",
                      ("push", "step/tree_accept"), "pop", "pop"]
    monkeypatch.setattr(timers, "_NVTX", (lambda name: events.append(name), lambda: events.append("pop")))
    events.clear()
    with StepTimer("cpu", enabled=False).range("step"):
        pass
    assert events == []
