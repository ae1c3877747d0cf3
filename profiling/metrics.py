"""Speculative-decoding metrics from run records: the one definition the reports, the CLI and the dashboard use.

Definitions (L = block_size - 1 drafted positions per step):
- tau: tokens committed per speculative (chain or DDTree) step, the bonus token included (1 <= tau <= L + 1), always
  total over total: over one run, or pooled over several (pooled_tau: all runs' committed tokens over all their
  steps; never a mean of per-run taus, which weighs every run alike however few steps it took).
- new_text_tau: tau over the steps that do not start on repeated text, with their count (new_text_steps). The rule
  (profiling/repeated_text.py): a step starts on repeated text when the 4-gram of the 3 tokens before it (the
  context: the prompt, the prefill's token, every committed token) and its first drafted token (the tree's
  depth-1 node of rank 0, the drafter's top guess) occurs among the last 32 tokens of that context; a step that
  drafted nothing is on new text. A target that loops makes the drafter's guesses easy: this tau leaves that out.
- distinct_4gram_rate: distinct 4-grams over all 4-grams of a run's generated tokens (averaged over runs;
  engine.training.ngrams): 1.0 never repeats itself, a loop of period p tends to p / (tokens - 3).
- per_position_acceptance[d], d = 0..L-1: fraction of steps whose accepted path reached depth d + 1.
- acceptance_histogram[k], k = 0..L: number of steps that accepted exactly k drafted tokens.
- tokens/s: generated tokens (after truncation to max_new_tokens, the prefill's token included) divided by
  the host wall time of the prefill plus every step (StepRecord.wall_ns, which includes reading the step's
  record back to the host).
- speedup: the speculative run's (chain or DDTree) tokens/s over AR tokens/s.
- expert traffic: per step, the distinct routed experts the verify touched per MoE layer and the weight bytes that
  costs (StepRecord.experts); expert_traffic() averages them over a run's steps.
- kernel rows: one per full range name; share = total time of that range / total time of the "step" range,
  for leaf and inner ranges alike (so shares of nested rows add up within their parent, not across levels).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.records import MODES, RunRecord, StepRecord
from engine.training.ngrams import DISTINCT_N, distinct_ngram_rate
from profiling.capture_data import Capture
from profiling.divergence import REAL, classify
from profiling.repeated_text import repeated_steps

STEP = "step"


def num_draft_positions(run: RunRecord) -> int:
    """L: drafted positions per step (block_size - 1)."""
    return int(run.decode["block_size"]) - 1


def run_time_ns(run: RunRecord) -> int:
    """Host wall time of the prefill plus every step."""
    return run.prefill_ns + sum(s.wall_ns for s in run.steps)


def tokens_per_s(run: RunRecord) -> float | None:
    """Generated tokens per second of host wall time (None when no time was recorded)."""
    ns = run_time_ns(run)
    return len(run.tokens) / (ns * 1e-9) if ns > 0 else None


def steps_tau(steps: Sequence[StepRecord]) -> float | None:
    """Tokens committed over steps, bonus included (None without steps)."""
    return sum(s.num_committed for s in steps) / len(steps) if steps else None


def tau(run: RunRecord) -> float | None:
    """Tokens committed per step of the run, bonus included (None for a run without steps)."""
    return steps_tau(run.steps)


def pooled_tau(runs: Sequence[RunRecord]) -> float | None:
    """Tau over several runs (prompts): all their committed tokens over all their steps (None: no steps)."""
    return steps_tau([s for run in runs for s in run.steps])


def new_text_tau(runs: Sequence[RunRecord]) -> tuple[float | None, int]:
    """The pooled tau of the runs' steps that start on new text (not repeated_steps), and how many steps that is."""
    steps = [s for run in runs for s, repeated in zip(run.steps, repeated_steps(run), strict=True) if not repeated]
    return steps_tau(steps), len(steps)


def distinct_4gram_rate(runs: Sequence[RunRecord]) -> float | None:
    """Distinct 4-grams over all 4-grams of each run's generated tokens, averaged over the runs (None: a run has
    fewer than 4 tokens)."""
    rows = [run.tokens for run in runs]
    return distinct_ngram_rate(rows, DISTINCT_N) if rows and min(map(len, rows)) >= DISTINCT_N else None


def acceptance_histogram(run: RunRecord) -> list[int]:
    """[L + 1] counts: entry k is the number of steps that accepted k drafted tokens."""
    counts = [0] * (num_draft_positions(run) + 1)
    for step in run.steps:
        counts[step.num_accepted] += 1
    return counts


def per_position_acceptance(run: RunRecord) -> list[float]:
    """[L] rates: entry d is the fraction of steps whose accepted path reached depth d + 1."""
    depth = num_draft_positions(run)
    if not run.steps:
        return [0.0] * depth
    return [sum(s.num_accepted > d for s in run.steps) / len(run.steps) for d in range(depth)]


def top2_gap(logits: np.ndarray) -> float:
    """Top-1 minus top-2 of one row of logits (0 for a vocabulary of one)."""
    if logits.shape[-1] < 2:
        return 0.0
    top = np.partition(logits, -2)[-2:]
    return float(top[1] - top[0])


def top2_gaps(run: RunRecord) -> list[float | None]:
    """Per generated token, top-1 minus top-2 of the logits that picked it: from RunRecord.logits, or without them
    (a run read from a report) from each step's logit_gap at its path's nodes, the prefill's token unknown (None)."""
    if run.logits is not None:
        return [top2_gap(row) for row in run.logits]
    gaps = [None] + [step.logit_gap[node] for step in run.steps for node in step.path]
    return gaps[:len(run.tokens)]


def committing_step(run: RunRecord, position: int) -> int | None:
    """Index of the step that committed generated token `position` (None: the prefill's token)."""
    start = 1
    for step in run.steps:
        if start <= position < start + step.num_committed:
            return step.index
        start += step.num_committed
    return None


def num_dropped(steps: list[StepRecord], index: int, max_new_tokens: int) -> int:
    """How many of step `index`'s committed tokens fall past max_new_tokens (the prefill's token is the first):
    the decode stops there, so they, the bonus token first, are not part of the output. Only a last step has any."""
    start = 1 + sum(s.num_committed for s in steps[:index])
    return min(steps[index].num_committed, max(0, start + steps[index].num_committed - max_new_tokens))


def first_divergence(ar: RunRecord, run: RunRecord) -> dict | None:
    """Where the speculative run's tokens first differ from the AR tokens (None when identical).

    logit_gap is top-1 minus top-2 of the AR logits at that position: a gap near 0 means the AR choice was
    a near tie, so a numerical difference can flip it; token_gap is how far below the AR top-1 the speculative
    run's token scored there; step is the speculative step that committed it."""
    a, d = ar.tokens, run.tokens
    n = min(len(a), len(d))
    position = next((i for i in range(n) if a[i] != d[i]), n)
    if position == n and len(a) == len(d):
        return None
    ar_token = a[position] if position < len(a) else None
    token = d[position] if position < len(d) else None
    logit_gap = token_gap = None
    if ar.logits is not None and position < len(ar.logits):
        row = np.asarray(ar.logits[position], dtype=np.float64)
        logit_gap = top2_gap(row)
        if token is not None:
            token_gap = float(row.max() - row[token])
    kind, score_gap, tolerance = classify(ar, position, token)
    return {"position": position, "ar_token": ar_token, "token": token, "logit_gap": logit_gap,
            "token_gap": token_gap, "step": committing_step(run, position), "kind": kind, "score_gap": score_gap,
            "tolerance": tolerance}


def check_runs(runs: dict[str, RunRecord]) -> None:
    """AR first, then speculative runs of the same model, prompt and decode config, each under its mode."""
    modes = list(runs)
    if not modes or modes[0] != "ar" or len(modes) < 2:
        raise ValueError(f"expected an AR run then at least one speculative run, got modes {modes}")
    ar = runs["ar"]
    for mode, run in runs.items():
        if run.mode != mode or mode not in MODES:
            raise ValueError(f"run under {mode!r} has mode {run.mode!r}")
        for what, x, y in (("prompt", ar.prompt, run.prompt), ("model config", ar.model, run.model),
                           ("decode config", ar.decode, run.decode)):
            if x != y:
                raise ValueError(f"the AR and {mode} runs differ in their {what}: compare runs of one decode_runs")


def primary_mode(runs: dict[str, RunRecord]) -> str:
    """The run a report headlines: DDTree when it ran, else the chain."""
    return "ddtree" if "ddtree" in runs else [m for m in runs if m != "ar"][-1]


def exactness_term(run: RunRecord) -> str:
    """What "the same tokens as AR" means for this run: greedy-exact at temperature 0, else seed-matched (AR and
    the speculative run drew the same keyed noise, engine/decoding/sampling.py)."""
    return "greedy-exact" if float(run.decode.get("temperature", 0.0)) == 0.0 else "seed-matched exact"


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def summarize(ar: RunRecord, run: RunRecord) -> dict:
    """Correctness, acceptance and speed of one speculative run (chain or DDTree) against AR."""
    if ar.mode != "ar" or run.mode == "ar":
        raise ValueError(f"expected an AR run and a chain or DDTree run, got modes {ar.mode!r} and {run.mode!r}")
    check_runs({"ar": ar, run.mode: run})
    ar_tps, tps = tokens_per_s(ar), tokens_per_s(run)
    new_text = new_text_tau([run])
    return {
        "mode": run.mode,
        "matches_ar": run.tokens == ar.tokens,
        "exactness": exactness_term(run),
        "ar_tokens": list(ar.tokens),
        "tokens": list(run.tokens),
        "ar_text": ar.text,
        "text": run.text,
        "num_generated": len(run.tokens),
        "num_steps": run.num_steps,
        "ar_num_steps": ar.num_steps,
        "block_size": int(run.decode["block_size"]),
        "budget": int(run.decode["budget"]) if run.mode == "ddtree" else num_draft_positions(run),
        "tau": tau(run),
        "new_text_tau": new_text[0],
        "new_text_steps": new_text[1],
        "distinct_4gram_rate": distinct_4gram_rate([run]),
        "per_position_acceptance": per_position_acceptance(run),
        "acceptance_histogram": acceptance_histogram(run),
        "ar_time_ms": run_time_ns(ar) / 1e6,
        "time_ms": run_time_ns(run) / 1e6,
        "ar_prefill_ms": ar.prefill_ns / 1e6,
        "prefill_ms": run.prefill_ns / 1e6,
        "ar_tokens_per_s": ar_tps,
        "tokens_per_s": tps,
        "speedup": _ratio(tps, ar_tps),
        "first_divergence": first_divergence(ar, run),
        "ar_expert_traffic": expert_traffic(ar),
        "expert_traffic": expert_traffic(run),
    }


def expert_traffic(run: RunRecord) -> dict | None:
    """What the run's verifies did to the routed experts, per step on average: `touched` per MoE layer, their sum
    `touched_total`, `bytes_read` (routed-expert weight bytes: touched x one expert's gate/up/down) and
    `bytes_per_token` (all steps' bytes over the tokens they committed). None: no MoE layer, or no steps."""
    counted = [s for s in run.steps if s.experts is not None]
    if not counted:
        return None
    touched = np.mean([s.experts.touched for s in counted], axis=0)
    bytes_read = [s.experts.bytes_read for s in counted]
    return {"touched": touched.tolist(), "touched_total": float(touched.sum()),
            "bytes_read": float(np.mean(bytes_read)),
            "bytes_per_token": sum(bytes_read) / sum(s.num_committed for s in counted)}


def real_divergences(summaries: dict[str, dict]) -> list[str]:
    """The modes whose tokens left AR's for a reason other than a numerics near tie (profiling/divergence.py)."""
    return [m for m, s in summaries.items() if s["first_divergence"] and s["first_divergence"]["kind"] == REAL]


def summarize_runs(runs: dict[str, RunRecord]) -> dict[str, dict]:
    """summarize() of every speculative run against the AR run, by mode."""
    check_runs(runs)
    return {mode: summarize(runs["ar"], run) for mode, run in runs.items() if mode != "ar"}


def range_parents(names: list[str]) -> dict[str, str | None]:
    """Each range's parent: the longest proper "/"-prefix that is itself a range ("step/verify/layer0/attn"
    -> "step/verify": "layer0" is a naming level, not a range)."""
    known = set(names)
    parents: dict[str, str | None] = {}
    for name in names:
        parts = name.split("/")
        parents[name] = next(("/".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)
                              if "/".join(parts[:k]) in known), None)
    return parents


def tree_order(names: list[str]) -> list[str]:
    """Names depth-first, a parent before its children, siblings in the order given."""
    parents = range_parents(names)
    children: dict[str | None, list[str]] = {}
    for name in names:
        children.setdefault(parents[name], []).append(name)
    out: list[str] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        name = stack.pop()
        out.append(name)
        stack.extend(reversed(children.get(name, [])))
    return out


def range_names(steps: list[StepRecord]) -> list[str]:
    """Every range name of the steps in tree order (siblings in the order they first completed, which for
    sequential siblings is the order they ran)."""
    seen: dict[str, None] = {}
    for step in steps:
        seen.update(dict.fromkeys(step.timings_ns))
    return tree_order(list(seen))


def kernel_table(run: RunRecord, capture: Capture | None = None) -> list[dict]:
    """One row per range name, in tree order: name, parent, depth, count (steps it ran in), total/mean/
    p50/p95 ms per step, self_ms (total minus its child ranges' totals), share of the total step time, and
    the profiler's host and device time of the same range when `capture` has them (else None)."""
    captured = capture.runs[run.mode].range_times() if capture is not None else {}
    on_device = capture is not None and "cuda" in capture.activities
    names = range_names(run.steps)
    parents = range_parents(names)
    step_total = sum(s.timings_ns.get(STEP, 0) for s in run.steps)
    totals = {n: sum(s.timings_ns.get(n, 0) for s in run.steps) for n in names}
    own = [self_ns(s.timings_ns) for s in run.steps]
    depth: dict[str, int] = {}
    rows = []
    for name in names:
        parent = parents[name]
        depth[name] = 0 if parent is None else depth[parent] + 1
        values = np.array([s.timings_ns[name] for s in run.steps if name in s.timings_ns], dtype=np.float64) / 1e6
        rows.append({
            "mode": run.mode, "name": name, "parent": parent, "depth": depth[name],
            "leaf": not any(parents[c] == name for c in names), "count": len(values),
            "total_ms": totals[name] / 1e6, "mean_ms": float(values.mean()),
            "p50_ms": float(np.percentile(values, 50)), "p95_ms": float(np.percentile(values, 95)),
            "self_ms": sum(o.get(name, 0) for o in own) / 1e6,
            "share": totals[name] / step_total if step_total else None,
            "profiler_cpu_ms": captured[name].cpu_ms if name in captured else None,
            "device_ms": captured[name].device_ms if on_device and name in captured else None,
        })
    return rows


def self_ns(timings_ns: dict[str, int]) -> dict[str, int]:
    """One step's ranges -> the time each spent outside its child ranges (these add up to the step's time)."""
    own = dict(timings_ns)
    for name, parent in range_parents(list(timings_ns)).items():
        if parent is not None:
            own[parent] -= timings_ns[name]
    return own


def stage_ns(step: StepRecord) -> dict[str, int]:
    """The step's top-level stages (direct children of "step") -> ns, in the order they ran."""
    parents = range_parents(list(step.timings_ns))
    return {n.removeprefix(STEP + "/"): ns for n, ns in step.timings_ns.items() if parents[n] == STEP}

