"""Small renderers shared by the pages: coloured token strips and per-step tables."""
from __future__ import annotations

from engine.records import MODE_LABELS, RunRecord, StepRecord
from profiling.metrics import committing_step, stage_ns, top2_gap

# Pastel colours that keep dark token text readable, cycled per step; the prefill token is grey.
STEP_COLOURS = ("#cfe2f3", "#fce5cd", "#d9ead3", "#ead1dc", "#fff2cc", "#d0e0e3", "#f4cccc", "#d9d2e9")
PREFILL_COLOUR = "#e0e0e0"


def number(value: float | None, spec: str, unit: str = "") -> str:
    """A metric's text; "-" where the engine had nothing to measure (no steps, no time recorded)."""
    return "-" if value is None else f"{value:{spec}}{unit}"


def step_colour(step: int) -> str:
    return PREFILL_COLOUR if step < 0 else STEP_COLOURS[step % len(STEP_COLOURS)]


def tokens_html(tokens: list[tuple[int, int]]) -> str:
    """Token ids as chips coloured by the step that committed them (-1: the prefill); hover names the step."""
    chips = []
    for token, step in tokens:
        label = "prefill" if step < 0 else f"step {step}"
        chips.append(f'<span title="{label}" style="background:{step_colour(step)};border-radius:4px;'
                     f'padding:2px 6px;margin:2px;display:inline-block;font-family:monospace">{int(token)}</span>')
    return f'<div style="line-height:2">{"".join(chips)}</div>' if chips else ""


def stage_rows(step: StepRecord) -> list[dict]:
    """The step's top-level stages (step/draft, step/verify, ...) with their time and share of the step."""
    total = step.timings_ns.get("step", 0)
    return [{"stage": name, "ms": ns / 1e6, "share": ns / total if total else 0.0}
            for name, ns in stage_ns(step).items()]


def tree_caption(step: StepRecord) -> str:
    tree = step.tree
    num_padding = sum(1 for i, p in enumerate(tree.parents) if i > 0 and p < 0)
    padding = f", {num_padding} of them padding" if num_padding else ""
    path = " -> ".join(f"{n} ({tree.tokens[n]})" for n in step.path)
    return (f"Step {step.index}: tree of **{tree.num_nodes} nodes** (root + {tree.num_nodes - 1} drafted{padding}), "
            f"depth {max(tree.depths)}. Accepted path (node (token)): {path}; bonus token **{step.bonus}**.")


def compare_rows(runs: dict[str, RunRecord]) -> list[dict]:
    """Position by position: the AR token, each speculative run's token, whether they all agree, the AR logits'
    top-1/top-2 gap there (a near tie is where numerics could flip greedy) and the step that committed it."""
    ar = runs["ar"]
    others = {mode: run for mode, run in runs.items() if mode != "ar"}
    rows = []
    for pos in range(max(len(run.tokens) for run in runs.values())):
        a = ar.tokens[pos] if pos < len(ar.tokens) else None
        row = {"position": pos, "AR": a}
        for mode, run in others.items():
            row[MODE_LABELS[mode]] = run.tokens[pos] if pos < len(run.tokens) else None
        row["equal"] = all(row[MODE_LABELS[m]] == a for m in others)
        row["AR top-1/top-2 gap"] = top2_gap(ar.logits[pos]) if ar.logits is not None and pos < len(ar.logits) \
            else None
        for mode, run in others.items():
            step = committing_step(run, pos)
            row[f"{MODE_LABELS[mode]} step"] = "prefill" if step is None else str(step)
        rows.append(row)
    return rows


def verdict(summary: dict) -> tuple[bool, str]:
    """(the speculative run emitted exactly the AR tokens?, the sentence that says so)."""
    n, label = summary["num_generated"], MODE_LABELS[summary["mode"]]
    div = summary["first_divergence"]
    term = summary["exactness"]
    if summary["matches_ar"]:
        return True, (f"{term.capitalize()}: {label} emitted exactly the AR tokens ({n} of {n} positions equal, "
                      f"in {summary['num_steps']} {label} steps vs {summary['ar_num_steps']} AR steps).")
    gap = "n/a" if div["logit_gap"] is None else f"{div['logit_gap']:.4g}"
    return False, (f"NOT {term}: {label} first diverges from AR at position {div['position']} "
                   f"(AR token {div['ar_token']}, {label} token {div['token']}); the AR logits' top-1/top-2 "
                   f"gap there is {gap}.")
