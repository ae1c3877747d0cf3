"""Every rank's timings of a tensor/expert-parallel run (engine/model/parallel.py), gathered on rank 0.

Communication time is the sum of a run's collective ranges (engine.model.parallel.is_collective: the attention and
dense MLP all-reduce, the MoE combine) over its steps; its share is that over the steps' own time. On CUDA the ranges
are CUDA events on the decode stream, so a collective's time includes its wait for the slowest rank.
"""
from __future__ import annotations

from engine.model.parallel import is_collective
from engine.records import MODE_LABELS, RunRecord

Ranks = list[dict[str, RunRecord]]  # rank r's runs by mode, in rank order


def communication_ns(run: RunRecord) -> int:
    """ns the run's steps spent in collective ranges."""
    return sum(ns for s in run.steps for name, ns in s.timings_ns.items() if is_collective(name))


def steps_ns(run: RunRecord) -> int:
    """ns of the run's timed steps (the "step" range)."""
    return sum(s.timings_ns.get("step", 0) for s in run.steps)


def ranks_table(ranks: Ranks) -> str:
    """One line per rank and run: step time, time in collectives and their share."""
    world = len(ranks)
    lines = [f"{'per rank (world ' + str(world) + ')':<28}{'steps ms':>12}{'communication ms':>18}{'share':>8}"]
    for rank, runs in enumerate(ranks):
        for mode, run in runs.items():
            total, comm = steps_ns(run), communication_ns(run)
            share = f"{comm / total:.0%}" if total else "-"
            lines.append(f"{f'rank {rank} {MODE_LABELS[mode]}':<28}{total / 1e6:>12.2f}{comm / 1e6:>18.2f}"
                         f"{share:>8}")
    return "\n".join(lines)
