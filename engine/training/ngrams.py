"""How much a text repeats itself, over token ids: torch-free, so the reports and the report reader use it too."""
from __future__ import annotations

from collections.abc import Sequence

DISTINCT_N = 4  # the n of the distinct-n rate every report and benchmark prints, and of the repeats training penalises


def distinct_ngram_rate(tokens: Sequence[Sequence[int]], n: int = DISTINCT_N) -> float:
    """Distinct n-grams over all n-grams of each row of tokens (a tensor [N, L], or lists of token ids whose lengths
    may differ), averaged over rows: 1.0 never repeats itself, a loop of period p tends to p / (L - n + 1)."""
    rows = tokens.tolist() if hasattr(tokens, "tolist") else [list(r) for r in tokens]
    short = [len(r) for r in rows if len(r) < n]
    if not rows or short:
        raise ValueError(f"need at least one row, each of at least n={n} tokens, got {len(rows)} row(s)"
                         + (f", the shortest of {min(short)} tokens" if short else ""))
    rates = [len({tuple(r[i:i + n]) for i in range(len(r) - n + 1)}) / (len(r) - n + 1) for r in rows]
    return sum(rates) / len(rates)
