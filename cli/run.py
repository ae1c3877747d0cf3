"""`python -m engine run`: AR and the speculative modes on one prompt, a progress bar, a summary table, and the
five exports.

Every input is checked before the decode starts, and the report directory before anything is written
(profiling/report.py), so an error (exit 2) leaves existing files untouched.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

from cli import options as opts
from cli.request import request_from_args
from engine.config import DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.model.parallel import init_from_env, leave
from engine.records import MODE_LABELS
from profiling.bandwidth import copy_bandwidth
from profiling.capture_view import summary_lines
from profiling.divergence import verdict
from profiling.measure import check_plan, measure
from profiling.measurement import Measurement
from profiling.metrics import real_divergences, tau
from profiling.progress import DecodeProgress
from profiling.ranks import ranks_table
from profiling.repeats import RepeatStats
from profiling.report import check_out_dir, write_all
from profiling.stage_floor import floor_table, run_floors
from profiling.tau_text import NEW_TEXT_NOTE


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def summary_table(measurement: Measurement) -> str:
    runs, summaries = measurement.runs, measurement.summaries
    ar = runs["ar"]
    first = next(iter(summaries.values()))
    columns = [("AR", ar, None), *((MODE_LABELS[m], runs[m], s) for m, s in summaries.items())]
    rows = [
        ("tokens generated", lambda r, s: len(r.tokens)),
        ("steps", lambda r, s: r.num_steps),
        ("tokens/step (tau)", lambda r, s: _num(tau(r), ".2f")),
        ("tau on new text", lambda r, s: "" if s is None else _num(s["new_text_tau"], ".2f")),
        ("new-text steps", lambda r, s: "" if s is None else f"{s['new_text_steps']}/{s['num_steps']}"),
        ("distinct-4", lambda r, s: "" if s is None else _num(s["distinct_4gram_rate"], ".2f")),
        ("prefill ms", lambda r, s: f"{(s or first)['prefill_ms' if s else 'ar_prefill_ms']:.2f}"),
        ("total ms", lambda r, s: f"{(s or first)['time_ms' if s else 'ar_time_ms']:.2f}"),
        ("tokens/s", lambda r, s: _num((s or first)["tokens_per_s" if s else "ar_tokens_per_s"], ".1f")),
        ("speedup", lambda r, s: "" if s is None else _num(s["speedup"], ".2f") + "x" + ("" if s["matches_ar"]
                                                                                       else "*")),
    ]
    lines = [f"{'':<20}" + "".join(f"{name:>12}" for name, _, _ in columns)]
    lines += [f"{label:<20}" + "".join(f"{value(r, s)!s:>12}" for _, r, s in columns) for label, value in rows]
    lines.append(f"target picks: {DecodeConfig(**ar.decode).sampling} (every mode draws the same keyed noise)")
    lines.append(NEW_TEXT_NOTE)
    for mode, s in summaries.items():
        label = MODE_LABELS[mode]
        lines.append(f"{label} acceptance histogram (steps accepting 0..L drafted tokens): "
                     + " ".join(map(str, s["acceptance_histogram"])))
    lines += [verdict(s, MODE_LABELS[mode]) for mode, s in summaries.items()]
    if ar.text is not None:
        lines += [f"prompt: {ar.prompt_text!r}", f"AR text: {ar.text!r}"]
        lines += [f"{MODE_LABELS[m]} text: {s['text']!r}" for m, s in summaries.items() if s["text"] != ar.text]
    if not all(s["matches_ar"] for s in summaries.values()):
        lines.append("* speedup measured over different outputs: the runs did not write the same text")
    return "\n".join(lines)


def repeats_table(repeats: RepeatStats) -> str:
    """profiling.repeats' statistics: one line per mode and statistic, median with p10-p90 and min-max."""
    lines = [f"{repeats.count} repeats after one warm-up:{'':<6}{'median':>10}{'p10':>10}{'p90':>10}{'min':>10}"
             f"{'max':>10}"]
    for mode, row in repeats.modes.items():
        for key, value in row.items():
            if key == "large_spread" or value["median"] is None or (mode == "ar" and key == "speedup"):
                continue
            lines.append(f"{MODE_LABELS[mode] + ' ' + key:<34}" + "".join(
                f"{value[k]:>10.3f}" for k in ("median", "p10", "p90", "min", "max")))
        lines += [f"large spread: {MODE_LABELS[mode]} {key} (p10-p90 over 20% of the median): take more repeats"
                  for key in row["large_spread"]]
    return "\n".join(lines)


def basis_line(measurement: Measurement) -> str:
    """Which runs the summary table's times and speedups come from: one run, or the median repeat of R."""
    repeats = measurement.repeats
    if repeats.count == 1:
        return ("one run: the times and speedups above come from a single decode of each mode (after an untimed "
                "warm-up), AR's and the others' at different moments; on a busy machine one run's speedup can be "
                "off by several x: take --repeats 5 for medians with their spread")
    return (f"the table above is the median repeat's runs (by its {MODE_LABELS[measurement.primary]} time); "
            f"medians over all {repeats.count} repeats, with p10-p90 and min-max, below")


def console_summary(measurement: Measurement, repeats: int) -> str:
    """What `run` prints of a measurement: the summary table and what it comes from, then the repeats, the ranks
    and the capture."""
    parts = [summary_table(measurement), basis_line(measurement)]
    if repeats > 1:
        parts.append(repeats_table(measurement.repeats))
    if measurement.ranks is not None:
        parts.append(ranks_table(measurement.ranks))
    if measurement.capture is not None:
        parts.append("\n".join(summary_lines(measurement.runs, measurement.capture)))
        parts.append(floors_text(measurement))
    return "\n".join(parts)


def floors_text(measurement: Measurement) -> str:
    """Every run's stages against their bytes floor, at the copy bandwidth measured now on the runs' device."""
    ar = measurement.runs["ar"]
    bandwidth = copy_bandwidth(str(ar.decode["device"]), str(ar.decode["dtype"]))
    return floor_table(run_floors(measurement.runs, bandwidth), MODE_LABELS, bandwidth)


def run_command(args: argparse.Namespace) -> int:
    try:
        check_plan(args.repeats, args.profile)
        request = request_from_args(args)
        if args.report is not None:
            check_out_dir(pathlib.Path(args.report), args.force)
        # under torchrun: join the group; every rank decodes, rank 0 reports
        shard = init_from_env(request.config.device)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return _decode_and_report(args, request, shard is None or shard.rank == 0)
    finally:
        leave()


def _decode_and_report(args: argparse.Namespace, request: DecodeRequest, leader: bool) -> int:
    """Every rank decodes; the leader prints the summary and writes the report."""
    progress = DecodeProgress(request.config.max_new_tokens) if leader else None
    repeated = args.repeats > 1  # repeats report their progress per repeat, a single decode per step
    measurement = measure(request, repeats=args.repeats, profile=args.profile, on_step=None if repeated else progress,
                          on_progress=(lambda done, total: print(f"repeat {done}/{total}", file=sys.stderr))
                          if repeated else None)
    if progress is not None:
        progress.finish()
    failed = real_divergences(measurement.summaries)
    if not leader:
        return 1 if failed else 0
    print(console_summary(measurement, args.repeats))
    if args.report is not None:
        try:
            paths = write_all(measurement, args.report, force=args.force)
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {', '.join(p.name for p in paths)} to {args.report}")
    return 1 if failed else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="AR and DDTree (and/or the chain) on one prompt; summary table and reports")
    opts.add_model_args(p)
    opts.add_prompt_args(p)
    opts.add_drafter_args(p)
    opts.add_decode_args(p)
    opts.add_tree_arg(p)
    p.add_argument("--profile", action="store_true", help="also capture the decode with torch.profiler")
    p.add_argument("--report", metavar="DIR", help="write report.html, report.json, kernels.csv, steps.csv and "
                                                   "trace.json into DIR")
    p.add_argument("--force", action="store_true", help="overwrite existing reports in DIR")
    p.add_argument("--repeats", type=int, default=1, metavar="R",
                   help="decode R times after one warm-up and print medians with their spread (profiling/repeats.py); "
                        "the summary and the reports' runs are the median repeat's, and the reports carry the "
                        "statistics of all R")
    p.set_defaults(func=run_command)
