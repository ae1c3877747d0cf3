"""What to show beside tau, in the same words everywhere (report.html, the Decode and Report pages): the tau of the
steps on new text with how many steps that is, and the distinct-4-gram rate of the text (profiling.metrics)."""
from __future__ import annotations

from profiling.repeated_text import RULE

NEW_TEXT_NOTE = (f"tau is the run's committed tokens over its steps; tau on new text is that of the steps that are "
                 f"not on repeated text ({RULE}: a target that repeats itself makes its drafter's guesses easy); "
                 "distinct-4 is the share of the generated tokens' 4-grams that are distinct (1: no repeat).")


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def beside_tau(new_text_tau: float | None, new_text_steps: int, num_steps: int,
               distinct_4gram_rate: float | None) -> str:
    """e.g. "2.10 on new text (41 of 52 steps) · distinct-4 0.78"."""
    return (f"{_number(new_text_tau)} on new text ({new_text_steps} of {num_steps} step{'s' * (num_steps != 1)}) · "
            f"distinct-4 {_number(distinct_4gram_rate)}")


def summary_beside_tau(summary: dict) -> str:
    """beside_tau of a profiling.metrics.summarize() summary."""
    return beside_tau(summary["new_text_tau"], summary["new_text_steps"], summary["num_steps"],
                      summary["distinct_4gram_rate"])
