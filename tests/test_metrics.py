"""profiling.metrics on synthetic run pairs: every number recomputed here another way."""
from __future__ import annotations

import random

import numpy as np
import pytest
from fake_records import fake_runs

from profiling import metrics
from profiling.spans import nested, packed_spans, run_spans, step_slots


def greedy_accept(tokens: list[int], parents: list[int], target: list[int]) -> list[int]:
    """tree_accept in plain Python: follow the child whose token is the current node's target."""
    path = [0]
    while True:
        nxt = [c for c in range(len(tokens)) if parents[c] == path[-1] and tokens[c] == target[path[-1]]]
        if not nxt:
            return path
        path.append(nxt[0])


def seeds(n: int) -> list[int]:
    return [random.randrange(2**31) for _ in range(n)]


@pytest.mark.parametrize("seed", seeds(4))
def test_fake_records_are_consistent(seed):
    ar, dd = fake_runs(seed).values()
    for step in (*ar.steps, *dd.steps):
        assert greedy_accept(step.tree.tokens, step.tree.parents, step.target) == step.path
        assert step.committed == [step.target[n] for n in step.path]
    generated = [dd.first_token] + [t for s in dd.steps for t in s.committed]
    assert generated[:len(dd.tokens)] == dd.tokens == ar.tokens


@pytest.mark.parametrize("seed", seeds(5))
def test_acceptance_metrics_agree_with_the_steps(seed):
    rng = random.Random(seed)
    block = rng.randint(2, 9)
    ar, dd = fake_runs(seed, budget=rng.randint(block - 1, 20), block_size=block, max_new=rng.randint(2, 30)).values()
    s = metrics.summarize(ar, dd)
    accepted = np.array([len(st.path) - 1 for st in dd.steps])
    hist = np.bincount(accepted, minlength=block)
    assert s["acceptance_histogram"] == hist.tolist() and len(hist) == block
    # reaching depth d+1 = accepting more than d tokens: a reversed cumulative sum of the histogram
    reached = hist[::-1].cumsum()[::-1][1:] / len(dd.steps)
    assert np.allclose(s["per_position_acceptance"], reached)
    assert s["tau"] == pytest.approx(np.mean([len(st.committed) for st in dd.steps]))
    assert s["tau"] == pytest.approx(1 + accepted.mean())
    assert s["num_steps"] == len(dd.steps) and s["ar_num_steps"] == len(ar.steps)
    assert s["matches_ar"] and s["first_divergence"] is None


@pytest.mark.parametrize("seed", seeds(3))
def test_speed_metrics(seed):
    ar, dd = fake_runs(seed).values()
    s = metrics.summarize(ar, dd)
    for run, prefix in ((ar, "ar_"), (dd, "")):
        seconds = (run.prefill_ns + sum(st.wall_ns for st in run.steps)) / 1e9
        assert s[f"{prefix}tokens_per_s"] == pytest.approx(len(run.tokens) / seconds)
        assert s[f"{prefix}time_ms"] == pytest.approx(run.wall_ns / 1e6)
    assert s["speedup"] == pytest.approx(s["tokens_per_s"] / s["ar_tokens_per_s"])


@pytest.mark.parametrize("seed", seeds(4))
def test_first_divergence(seed):
    rng = random.Random(seed)
    max_new = rng.randint(3, 20)
    at = rng.randrange(max_new)
    ar, dd = fake_runs(seed, max_new=max_new, diverge_at=at).values()
    div = metrics.summarize(ar, dd)["first_divergence"]
    assert div["position"] == at
    assert div["ar_token"] == ar.tokens[at] != div["token"] == dd.tokens[at]
    row = np.sort(ar.logits[at])
    assert div["logit_gap"] == pytest.approx(row[-1] - row[-2])
    assert div["token_gap"] == pytest.approx(ar.logits[at].max() - ar.logits[at][dd.tokens[at]])
    if at == 0:
        assert div["step"] is None
    else:
        step = dd.steps[div["step"]]
        before = 1 + sum(len(s.committed) for s in dd.steps[:step.index])
        assert before <= at < before + len(step.committed)


def test_first_divergence_of_different_lengths():
    ar, dd = fake_runs(random.randrange(2**31)).values()
    dd.tokens = dd.tokens[:-2]
    div = metrics.first_divergence(ar, dd)
    assert div["position"] == len(dd.tokens) and div["token"] is None and div["token_gap"] is None


def test_summarize_rejects_runs_that_are_not_a_pair():
    ar, dd = fake_runs(random.randrange(2**31)).values()
    with pytest.raises(ValueError, match="an AR run and a chain or DDTree run, got modes 'ddtree' and 'ar'"):
        metrics.summarize(dd, ar)
    with pytest.raises(ValueError, match="an AR run then at least one speculative run"):
        metrics.summarize_runs({"ddtree": dd})
    other_ar, _ = fake_runs(random.randrange(2**31), block_size=3).values()
    with pytest.raises(ValueError, match="differ in their"):
        metrics.summarize(other_ar, dd)


@pytest.mark.parametrize("seed", seeds(3))
def test_kernel_table(seed):
    ar, dd = fake_runs(seed).values()
    for run in (ar, dd):
        rows = metrics.kernel_table(run)
        by_name = {r["name"]: r for r in rows}
        names = {n for s in run.steps for n in s.timings_ns}
        assert set(by_name) == names and len(rows) == len(names)
        step_total = sum(s.timings_ns["step"] for s in run.steps)
        for r in rows:
            values = [s.timings_ns[r["name"]] / 1e6 for s in run.steps if r["name"] in s.timings_ns]
            assert r["count"] == len(values)
            assert r["total_ms"] == pytest.approx(sum(values))
            assert r["p50_ms"] == pytest.approx(np.median(values))
            assert min(values) <= r["p95_ms"] <= max(values)
            assert r["share"] == pytest.approx(r["total_ms"] * 1e6 / step_total)
            if r["parent"] is not None:
                assert r["name"].startswith(r["parent"] + "/")
                assert r["depth"] == by_name[r["parent"]]["depth"] + 1
                assert rows.index(by_name[r["parent"]]) < rows.index(r)  # tree order: parent first
        for r in rows:  # children's shares add up to at most the parent's
            kids = [k for k in rows if k["parent"] == r["name"]]
            assert r["leaf"] == (not kids)
            assert sum(k["share"] for k in kids) <= r["share"] + 1e-12
            assert r["self_ms"] == pytest.approx(r["total_ms"] - sum(k["total_ms"] for k in kids))
        assert by_name["step/verify/layer0/attn"]["parent"] == "step/verify"  # "layer0" is not a range
        assert by_name["step"]["share"] == 1.0


def test_range_parents_and_tree_order():
    names = ["step/a/x", "step/a", "step/b", "step/b/y/z", "step", "other"]
    parents = metrics.range_parents(names)
    assert parents == {"step/a/x": "step/a", "step/a": "step", "step/b": "step", "step/b/y/z": "step/b",
                       "step": None, "other": None}
    assert metrics.tree_order(names) == ["step", "step/a", "step/a/x", "step/b", "step/b/y/z", "other"]


@pytest.mark.parametrize("seed", seeds(3))
def test_packed_spans_keep_durations_and_nest(seed):
    ar, dd = fake_runs(seed).values()
    for step in dd.steps:
        spans = packed_spans(step.timings_ns)
        assert {s.name: s.dur_ns for s in spans} == step.timings_ns  # parents cover children: nothing clipped
        assert nested(spans) == [(s, s.name.count("/") - ("/layer" in s.name)) for s in spans]


@pytest.mark.parametrize("seed", seeds(2))
def test_run_spans_lay_steps_back_to_back(seed):
    _, dd = fake_runs(seed).values()
    slots = step_slots(dd)
    assert slots[0][0] == dd.prefill_ns
    for (a, la), (b, _) in zip(slots, slots[1:], strict=False):
        assert b == a + la
    spans = run_spans(dd)
    for s in spans:
        if s.step is not None:
            start, length = slots[s.step]
            assert start <= s.start_ns and s.end_ns <= start + length
