"""Budget sweep: decode one prompt with DDTree at several tree budgets B, to read off the best B for a model
and device (`python -m engine sweep`, and the dashboard's Profile page).

Larger trees accept more tokens per step (tau grows) but cost more per verify; the row with the lowest median
ms_per_token is the fastest, and it is a clear winner only when its p10-p90 range over the repeats lies wholly
below every other budget's (`winner`): otherwise the sweep says which budgets it cannot tell apart. Speed follows
profiling.metrics (generated tokens over prefill + step wall time).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from engine.config import AUTO_BUDGET_MAX, MAX_BUDGET, DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.decoding.session import continuation_of, load_target, make_decoder
from engine.model.target import TargetModel
from engine.records import StepRecord
from profiling.job import Job, Plan
from profiling.metrics import run_time_ns, tau
from profiling.repeats import stats

DEFAULT_BUDGETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, "auto")  # auto: --budget auto beside the fixed budgets
QUICK_BUDGETS = (4, 16, 64, "auto:64")  # the Profile page's first sweep: a few seconds on the CPU; type more there
QUICK_REPEATS = 2  # its decodes per budget: the fewest that measure a spread


def parse_budgets(text: str) -> list[int | str]:
    """Budgets typed as "1, 2, 4, auto" or "1 2 4 auto:64": the fixed ones sorted, duplicates dropped, each in
    [0, MAX_BUDGET], then the auto ones as "auto:MAX" (auto alone: auto:AUTO_BUDGET_MAX)."""
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    if not parts:
        raise ValueError(f"no budgets given: type integers in [0, {MAX_BUDGET}] separated by commas or spaces")
    auto = [p for p in parts if re.fullmatch(r"auto(:\d+)?", p)]
    fixed = [p for p in parts if p not in auto]
    bad = [p for p in fixed if not re.fullmatch(r"\d+", p) or int(p) > MAX_BUDGET]
    bad += [p for p in auto if not 1 <= int(p.partition(":")[2] or AUTO_BUDGET_MAX) <= MAX_BUDGET]
    if bad:
        raise ValueError(f"budgets {bad[:5]} are not integers in [0, {MAX_BUDGET}] or auto[:MAX] with MAX in "
                         f"[1, {MAX_BUDGET}]: type e.g. 1, 2, 4, 8, auto")
    labels = sorted({f"auto:{p.partition(':')[2] or AUTO_BUDGET_MAX}" for p in auto}, key=lambda s: int(s[5:]))
    return [*sorted({int(p) for p in fixed}), *labels]


def config_for(cfg: DecodeConfig, budget: int | str) -> DecodeConfig:
    """cfg at one sweep budget: a fixed B, or "auto:MAX"."""
    if isinstance(budget, str):
        return dataclasses.replace(cfg, budget=int(budget.partition(":")[2]), auto_budget=True)
    return dataclasses.replace(cfg, budget=budget, auto_budget=False)


def budget_sweep(request: DecodeRequest, budgets: Sequence[int | str], repeats: int = 1,
                 model: TargetModel | None = None, on_progress: Callable[[int, int], None] | None = None,
                 on_step: Callable[[StepRecord], None] | None = None) -> list[dict]:
    """DDTree decodes of the request's prompt with its drafter at each budget (its config's budget is replaced), in
    increasing budget order.

    Returns rows {budget, tau, ms_per_token, ms_p10, ms_p90, tokens_per_s, num_steps, repeats}: ms_per_token is
    the median over `repeats` decodes with its p10 and p90 (profiling.repeats.stats), tokens_per_s its inverse
    (the tokens and steps are the same every time). The target's continuation (what an oracle drafter
    knows) is computed once, and one untimed decode at the first budget runs first so that one-time costs (lazy
    kernel and allocator set-up) do not land on the smallest budget. on_progress(done, total) follows each
    budget, on_step sees every step of every decode (the untimed one included)."""
    configs = sweep_configs(request.config, budgets, repeats)
    ckpt, prompt, cfg = request.checkpoint, request.prompt, request.config
    model = model or load_target(ckpt, cfg)
    truth = continuation_of(ckpt, prompt, cfg, model)(cfg.max_new_tokens + cfg.block_size)

    def run(c: DecodeConfig):
        return make_decoder(ckpt, prompt, c, "ddtree", request.drafter, model=model, continuation=truth).run(on_step)

    run(configs[0])
    rows = []
    for i, c in enumerate(configs):
        records = [run(c) for _ in range(repeats)]
        ms = stats([run_time_ns(r) / 1e6 / len(r.tokens) for r in records])
        budget = c.budget_label if c.auto_budget else c.budget
        rows.append({"budget": budget, "tau": tau(records[0]), "ms_per_token": ms["median"],
                     "ms_p10": ms["p10"], "ms_p90": ms["p90"], "tokens_per_s": 1e3 / ms["median"],
                     "num_steps": records[0].num_steps, "repeats": repeats})
        if on_progress is not None:
            on_progress(i + 1, len(configs))
    return rows


def sweep_configs(cfg: DecodeConfig, budgets: Sequence[int | str], repeats: int) -> list[DecodeConfig]:
    """The configs a sweep of `budgets` decodes, in its order (fixed budgets rising, then auto); checked."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: expected an integer >= 1")
    configs = [config_for(cfg, b) for b in budgets]  # DecodeConfig validates each budget
    configs = sorted({c.budget_label: c for c in configs}.values(), key=lambda c: (c.auto_budget, c.budget))
    if not configs:
        raise ValueError("no budgets to sweep: give at least one budget")
    return configs


def sweep_job(request: DecodeRequest, model: TargetModel, budgets: Sequence[int | str], repeats: int) -> Job:
    """budget_sweep() as a Job (profiling/job.py), stoppable at every step; its result is the rows. Its decodes:
    the untimed one, then `repeats` per budget."""
    num_budgets = len(sweep_configs(request.config, budgets, repeats))
    plan = Plan(1 + num_budgets * repeats, request.config.max_new_tokens, "decode")
    return Job("sweep", plan, lambda job: budget_sweep(
        request, budgets, repeats, model, on_progress=lambda done, total: job.units_done(1 + done * repeats),
        on_step=lambda s: job.step(s.num_committed)))


def fastest(rows: list[dict]) -> dict:
    """The row with the lowest median time per generated token."""
    return min(rows, key=lambda r: r["ms_per_token"])


def ties(rows: list[dict]) -> list[dict]:
    """The rows the fastest cannot be told apart from: their p10-p90 range reaches into the fastest's."""
    best = fastest(rows)
    return [r for r in rows if r is not best and r["ms_p10"] <= best["ms_p90"]]


def winner(rows: list[dict]) -> dict | None:
    """The fastest row when it is separated from every other by more than the spread, else None (also with one
    decode per budget, which measures no spread)."""
    return None if ties(rows) or fastest(rows)["repeats"] < 2 else fastest(rows)


def verdict(rows: list[dict]) -> str:
    """One sentence: the budget to use, or the budgets the repeats cannot separate."""
    best, close = fastest(rows), ties(rows)
    if best["repeats"] < 2:
        return (f"lowest time: B = {best['budget']} ({best['ms_per_token']:.3f} ms per token); one decode per "
                "budget measures no spread, so no budget is called the fastest: take --repeats 3 or more")
    if not close:
        return (f"fastest: B = {best['budget']} ({best['ms_per_token']:.3f} ms per token, clear of every other "
                f"budget's p10-p90 range)")
    others = ", ".join(str(r["budget"]) for r in close)
    return (f"no clear fastest: B = {best['budget']} has the lowest median ({best['ms_per_token']:.3f} ms per "
            f"token) but its p10-p90 range overlaps B = {others}; take more repeats or quiet the machine")


def format_rows(rows: list[dict]) -> str:
    """A fixed-width table with each budget's p10-p90 range, the clear winner marked, and the verdict."""
    best = winner(rows)
    lines = [f"{'budget':>6} {'tau':>6} {'ms/token':>9} {'p10':>8} {'p90':>8} {'tokens/s':>9} {'steps':>5}"]
    lines += [f"{r['budget']:>6} {r['tau']:>6.2f} {r['ms_per_token']:>9.3f} {r['ms_p10']:>8.3f} {r['ms_p90']:>8.3f} "
              f"{r['tokens_per_s']:>9.1f} {r['num_steps']:>5}{'  <- fastest' if r is best else ''}" for r in rows]
    return "\n".join([*lines, verdict(rows)])
