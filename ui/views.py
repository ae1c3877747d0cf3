"""Small renderers shared by the pages: coloured token strips and per-step tables."""
from __future__ import annotations

import html
from collections.abc import Callable

from engine.loaders.text import TokenizerError
from engine.records import MODE_LABELS, RunRecord, StepRecord
from profiling import divergence
from profiling.metrics import committing_step, stage_ns, top2_gaps
from ui.safe_text import code

PREFILL_COLOUR = "#e0e0e0"
GOLDEN_ANGLE = 137.508  # degrees: consecutive steps get hues far apart, and no two of the first hundreds match


def number(value: float | None, spec: str, unit: str = "") -> str:
    """A metric's text; "-" where the engine had nothing to measure (no steps, no time recorded)."""
    return "-" if value is None else f"{value:{spec}}{unit}"


def step_colour(step: int) -> str:
    """A pastel that keeps dark token text readable, its hue stepped by the golden angle (step 0 and step 8 no
    longer look alike); alternate steps are a shade lighter. The prefill's token is grey."""
    if step < 0:
        return PREFILL_COLOUR
    return f"hsl({step * GOLDEN_ANGLE % 360:.1f}, 70%, {82 if step % 2 else 88}%)"


def piece_of(tokenizer) -> Callable[[int], str] | None:
    """token -> display piece by the tokenizer's piece() (engine.loaders.text.Tokenizer, or a recording's
    vocabulary), None without one; an id the tokenizer does not know shows as <id N>."""
    if tokenizer is None:
        return None

    def piece(token: int) -> str:
        try:
            return tokenizer.piece(int(token))
        except TokenizerError:
            return f"<id {int(token)}>"
    return piece


def tokens_html(tokens: list[tuple[int, int]], piece: Callable[[int], str] | None = None) -> str:
    """Tokens as chips coloured by the step that committed them (-1: the prefill), showing their text piece
    where the model has a tokenizer (else the id); hover gives the id and the step."""
    chips = []
    for token, step in tokens:
        label = "prefill" if step < 0 else f"step {step}"
        text = str(int(token)) if piece is None else piece(token)
        chips.append(f'<span title="id {int(token)} · {label}" style="background:{step_colour(step)};'
                     f'border-radius:4px;padding:2px 6px;margin:2px;display:inline-block;font-family:monospace;'
                     f'white-space:pre">{html.escape(text)}</span>')
    return f'<div style="line-height:2">{"".join(chips)}</div>' if chips else ""


def text_html(prompt: str, generated: str) -> str:
    """The prompt (grey) followed by the generated text, whitespace kept."""
    return (f'<pre style="white-space:pre-wrap;font-size:0.9em;padding:8px;background:#f8f8f8;border-radius:4px">'
            f'<span style="color:#888">{html.escape(prompt)}</span>{html.escape(generated)}</pre>')


def stage_rows(step: StepRecord) -> list[dict]:
    """The step's top-level stages (step/draft, step/verify, ...) with their time and share of the step."""
    total = step.timings_ns.get("step", 0)
    return [{"stage": name, "ms": ns / 1e6, "share": ns / total if total else 0.0}
            for name, ns in stage_ns(step).items()]


def tree_caption(step: StepRecord, piece: Callable[[int], str] | None = None, num_dropped: int = 0) -> str:
    """num_dropped: the step's committed tokens past max_new_tokens (profiling.metrics.num_dropped), said so."""
    tree = step.tree
    num_padding = sum(1 for i, p in enumerate(tree.parents) if i > 0 and p < 0)
    padding = f", {num_padding} of them padding" if num_padding else ""

    def token(t: int) -> str:
        return str(t) if piece is None else f"{t} {code(piece(t))}"
    path = " -> ".join(f"{n} ({token(tree.tokens[n])})" for n in step.path)
    return (f"Step {step.index}: tree of **{tree.num_nodes} nodes** (root + {tree.num_nodes - 1} drafted{padding}), "
            f"depth {max(tree.depths)}. Accepted path (node (token)): {path}; bonus token **{token(step.bonus)}**"
            + (f", not committed: max_new_tokens was reached, so the step's last {num_dropped} token(s) were dropped."
               if num_dropped else "."))


def path_rows(step: StepRecord, piece: Callable[[int], str] | None = None,
              spine: list[int] | None = None) -> list[dict]:
    """A path from the root (the accepted path unless `spine` names another) and the siblings of its nodes (the
    alternatives the walk passed over), depth by depth, then the children of its last node. Root first."""
    tree = step.tree
    nodes = [0] + [c for parent in (spine or step.path) for c in sorted(tree.children(parent),
                                                                         key=lambda c: tree.ranks[c])]
    return [{"node": n, "token": tree.tokens[n] if piece is None else f"{tree.tokens[n]} {piece(tree.tokens[n])}",
             "depth": tree.depths[n], "rank": tree.ranks[n], "cum. log-prob": tree.scores[n],
             "accepted": n in step.path} for n in nodes]


def node_prob_rows(step: StepRecord, piece: Callable[[int], str] | None = None) -> list[dict]:
    """Per drafted node (padding left out): its token, where it sits, and what the target and the drafter give
    it (StepRecord.probs): the target's probability of the token given its path, the drafter's marginal at its
    depth, and the target's chance that the walk moves past it."""
    tree, p = step.tree, step.probs
    return [{"node": n, "token": tree.tokens[n] if piece is None else f"{tree.tokens[n]} {piece(tree.tokens[n])}",
             "depth": tree.depths[n], "rank": tree.ranks[n], "parent": tree.parents[n], "accepted": n in step.path,
             "target p": p.target[n], "drafter marginal": p.draft[n], "moves on": p.move_on[n]}
            for n in range(1, tree.num_nodes) if tree.parents[n] >= 0]


def compare_rows(runs: dict[str, RunRecord]) -> list[dict]:
    """Position by position: the AR token, each speculative run's token, whether they all agree, the AR logits'
    top-1/top-2 gap there (a near tie is where numerics could flip greedy) and the step that committed it."""
    ar = runs["ar"]
    gaps = top2_gaps(ar)
    others = {mode: run for mode, run in runs.items() if mode != "ar"}
    rows = []
    for pos in range(max(len(run.tokens) for run in runs.values())):
        a = ar.tokens[pos] if pos < len(ar.tokens) else None
        row = {"position": pos, "AR": a}
        for mode, run in others.items():
            row[MODE_LABELS[mode]] = run.tokens[pos] if pos < len(run.tokens) else None
        row["equal"] = all(row[MODE_LABELS[m]] == a for m in others)
        row["AR top-1/top-2 gap"] = gaps[pos] if pos < len(gaps) else None
        for mode, run in others.items():
            step = committing_step(run, pos)
            row[f"{MODE_LABELS[mode]} step"] = "prefill" if step is None else str(step)
        rows.append(row)
    return rows


def verdict(summary: dict) -> tuple[bool, str]:
    """(the speculative run emitted exactly the AR tokens?, the sentence that says so; where it did not, the
    divergence's classification: profiling.divergence.verdict)."""
    n, label = summary["num_generated"], MODE_LABELS[summary["mode"]]
    term = summary["exactness"]
    if summary["matches_ar"]:
        return True, (f"{term.capitalize()}: {label} emitted exactly the AR tokens ({n} of {n} positions equal, "
                      f"in {summary['num_steps']} {label} steps vs {summary['ar_num_steps']} AR steps).")
    return False, divergence.verdict(summary, label) + "."


def divergence_warning(summary: dict) -> str | None:
    """None when the run's tokens equal AR's; else the warning every page that shows speed gives: the texts
    differ, how (numerics near tie or a real divergence), and that the speedup compares different outputs."""
    exact, sentence = verdict(summary)
    if exact:
        return None
    return (f"The {MODE_LABELS[summary['mode']]} and AR texts differ. {sentence} Its speedup is measured over "
            "different outputs.")


def speedup(summary: dict) -> str:
    """The speedup over AR, labelled when the two runs' outputs differ."""
    text = number(summary["speedup"], ".2f", "x")
    return text if summary["matches_ar"] else f"{text} (over different outputs)"


def spread_text(s: dict) -> str:
    """A statistic's median with its spread: "median 12.3 (p10-p90 11.9-12.8, min-max 11.5-13.0, n 5)"."""
    if s["median"] is None:
        return "-"
    return (f"median {s['median']:.3g} (p10-p90 {s['p10']:.3g}-{s['p90']:.3g}, min-max {s['min']:.3g}-"
            f"{s['max']:.3g}, n {s['n']})")


STATISTICS = {"tokens_per_s": "tokens/s", "speedup": "speedup", "time_ms": "time ms", "ttft_ms": "TTFT ms",
              "itl_p50_ms": "ITL p50 ms", "itl_p95_ms": "ITL p95 ms"}  # profiling.repeats' statistics, as shown


def repeat_rows(measured: dict[str, dict]) -> list[dict]:
    """profiling.repeats.summarize_repeats as table rows: one per mode and statistic (AR has no speedup)."""
    fields = ("median", "p10", "p90", "min", "max", "n")
    return [{"mode": MODE_LABELS[mode], "statistic": STATISTICS[key], **{k: row[key][k] for k in fields}}
            for mode, row in measured.items() for key in STATISTICS if not (mode == "ar" and key == "speedup")]
