"""Repeated measurement: decode a DecodeRequest R times (one warm-up first) and summarise the timings as medians with
their spread, so that one noisy run does not decide a speedup.

Per mode, over the R repeats: tokens/s, speedup over the same repeat's AR run, total time, time to first token
(TTFT: the prefill, which produces the first token) and the inter-token latency (ITL) p50 and p95 of each
repeat. ITL is the time between consecutive deliveries of tokens: a step delivers all its committed tokens at
once, so each step is one gap (AR: one token per step), as vLLM's and SGLang's benchmarks time streamed chunks.
Each statistic is {median, p10, p90, min, max, n}. The spread is *large* when (p90 - p10) / median exceeds
LARGE_SPREAD for tokens/s or speedup: then the numbers move more than a typical speedup difference, and more
repeats (or a quieter machine) are needed before reading them.

RepeatStats is what the reports carry of the repeats (report.json's `repeats`, kernels.csv's mean_ms_* columns):
a report holds the runs of one repeat, so the spread over all of them travels beside it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.records import RunRecord
from profiling.capture_data import Capture
from profiling.metrics import kernel_table, run_time_ns, tokens_per_s

LARGE_SPREAD = 0.2  # (p90 - p10) / median above this is a large spread
HEADLINE = ("tokens_per_s", "speedup")  # the statistics the large-spread warning looks at
STATISTICS = ("tokens_per_s", "speedup", "time_ms", "ttft_ms", "itl_p50_ms", "itl_p95_ms")  # per mode
STAT_FIELDS = ("median", "p10", "p90", "min", "max", "n")  # what stats() gives
RANGE_COLUMNS = tuple(f"mean_ms_{k}" for k in STAT_FIELDS)  # a kernel row's spread of mean_ms over the repeats


def stats(values: Sequence[float]) -> dict:
    """{median, p10, p90, min, max, n} of the values (None entries dropped; all None: every field None)."""
    xs = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if xs.size == 0:
        return {"median": None, "p10": None, "p90": None, "min": None, "max": None, "n": 0}
    p10, median, p90 = np.percentile(xs, [10, 50, 90])
    return {"median": float(median), "p10": float(p10), "p90": float(p90), "min": float(xs.min()),
            "max": float(xs.max()), "n": int(xs.size)}


def relative_spread(s: dict) -> float | None:
    """(p90 - p10) / median, None when there is no median to divide by."""
    return (s["p90"] - s["p10"]) / s["median"] if s["median"] else None


def inter_token_ms(run: RunRecord) -> list[float]:
    """The gaps between token deliveries: each step's wall time (ms), in order."""
    return [step.wall_ns / 1e6 for step in run.steps]


def summarize_repeats(repeated: list[dict[str, RunRecord]]) -> dict[str, dict]:
    """Per mode (AR first): the statistics above, and large_spread, the headline statistics that spread more
    than LARGE_SPREAD."""
    out = {}
    for mode in repeated[0]:
        runs = [r[mode] for r in repeated]
        itl = [inter_token_ms(run) for run in runs]
        row = {
            "tokens_per_s": stats([tokens_per_s(run) for run in runs]),
            "speedup": stats([_ratio(tokens_per_s(r[mode]), tokens_per_s(r["ar"])) for r in repeated]),
            "time_ms": stats([run_time_ns(run) / 1e6 for run in runs]),
            "ttft_ms": stats([run.prefill_ns / 1e6 for run in runs]),
            "itl_p50_ms": stats([float(np.percentile(x, 50)) if x else None for x in itl]),
            "itl_p95_ms": stats([float(np.percentile(x, 95)) if x else None for x in itl]),
        }
        row["large_spread"] = large_spread(row)
        out[mode] = row
    return out


def large_spread(row: dict) -> list[str]:
    """The headline statistics of one mode's row that spread more than LARGE_SPREAD."""
    return [k for k in HEADLINE if (relative_spread(row[k]) or 0.0) > LARGE_SPREAD]


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def range_stats(repeated: list[dict[str, RunRecord]], mode: str) -> dict[str, dict]:
    """Per timed range of `mode`'s runs: stats of its mean ms per call over the repeats."""
    per_range: dict[str, list[float]] = {}
    for r in repeated:
        for row in kernel_table(r[mode]):
            per_range.setdefault(row["name"], []).append(row["mean_ms"])
    return {name: stats(values) for name, values in per_range.items()}


def median_repeat(repeated: list[dict[str, RunRecord]], mode: str) -> dict[str, RunRecord]:
    """The repeat whose `mode` run took the median time: a real run to show beside the statistics."""
    order = sorted(range(len(repeated)), key=lambda i: run_time_ns(repeated[i][mode]))
    return repeated[order[len(order) // 2]]


@dataclass(frozen=True, slots=True)
class RepeatStats:
    """The statistics of R repeats, as the reports carry them beside the runs of one repeat."""

    count: int  # R: measured repeats (the warm-up not counted)
    modes: dict[str, dict]  # summarize_repeats(): per mode, each of STATISTICS as stats(), and large_spread
    ranges: dict[str, dict[str, dict]]  # per mode, per range name: stats() of its mean ms per call (range_stats)


def repeat_stats(repeated: list[dict[str, RunRecord]]) -> RepeatStats:
    """What the reports say about `repeated` (one repeat: every statistic's n is 1)."""
    if not repeated:
        raise ValueError("repeat statistics need at least one repeat")
    return RepeatStats(len(repeated), summarize_repeats(repeated),
                       {mode: range_stats(repeated, mode) for mode in repeated[0]})


def kernel_rows(runs: dict[str, RunRecord], repeats: RepeatStats, capture: Capture | None = None) -> list[dict]:
    """kernels.csv's rows (report.json's `kernels`): metrics.kernel_table of every run, then each range's spread of
    mean_ms over the repeats (RANGE_COLUMNS; None for a range no repeat's statistics hold)."""
    if list(repeats.modes) != list(runs):
        raise ValueError(f"the repeat statistics cover modes {list(repeats.modes)}, the runs {list(runs)}")
    rows = []
    for mode, run in runs.items():
        for row in kernel_table(run, capture):
            spread = repeats.ranges[mode].get(row["name"], {})
            rows.append(row | {col: spread.get(k) for col, k in zip(RANGE_COLUMNS, STAT_FIELDS, strict=True)})
    return rows
