"""Why a speculative run left the AR tokens: a numerics near tie, or a real divergence (a bug).

In the fast mode a verify over B + 1 rows and an AR step over one row reduce in different orders, so their
logits differ in the last bits; where AR's pick and the speculative run's token score within that noise, either
is a correct pick. The rule: the speculative token is a *numerics near tie* when AR scored it within
tolerance(dtype, m) of AR's own pick, m = |AR's best score| at that position and

    tolerance = 2**-6 * max(1, m)   in bfloat16 (two bfloat16 steps at that magnitude)
    tolerance = 1e-5 * max(1, m)    in float32 (the largest AR-vs-verify difference measured on the tiny model,
                                    4e-5 at logits of about 10, is 4e-6 relative)

At temperature T > 0 the score is the filtered logit / T plus the position's keyed Gumbel noise (what the pick
maximises) and the tolerance shrinks by 1 / T with it. Anything else is a *real divergence*, and so is every
divergence in the batch-invariant mode, which computes each row exactly as AR does.
"""
from __future__ import annotations

import numpy as np

from engine.config import DecodeConfig
from engine.records import RunRecord

NEAR_TIE = "numerics near tie"
REAL = "real divergence"
RELATIVE_TOLERANCE = {"bfloat16": 2.0 ** -6, "float32": 1e-5}


def ar_scores(ar: RunRecord, position: int) -> np.ndarray:
    """What AR's pick maximised at generated position `position`: its logits (greedy), or its filtered logits
    / T plus the keyed Gumbel noise (sampled)."""
    cfg = DecodeConfig(**ar.decode)
    logits = np.asarray(ar.logits[position], dtype=np.float32)
    if cfg.temperature == 0.0:
        return logits.astype(np.float64)
    import torch  # the sampler's noise, as the decode drew it: only a sampled run needs torch here

    from engine.decoding.sampling import filtered_logits, uniforms

    row = torch.from_numpy(logits)[None]
    noise = uniforms(cfg.seed, torch.tensor([len(ar.prompt) + position]), row.shape[1])
    return (filtered_logits(row, cfg) - torch.log(-torch.log(noise)))[0].double().numpy()


def tolerance(decode: dict, magnitude: float) -> float:
    """The near-tie tolerance of a decode config's dtype and temperature at a score of that magnitude."""
    scale = float(decode.get("temperature", 0.0)) or 1.0
    return RELATIVE_TOLERANCE[decode["dtype"]] * max(1.0, magnitude) / scale


def classify(ar: RunRecord, position: int, token: int | None) -> tuple[str, float | None, float | None]:
    """(kind, how far below AR's pick AR scored `token`, the tolerance) at a divergence."""
    if token is None or ar.logits is None or position >= len(ar.logits):
        return REAL, None, None
    scores = ar_scores(ar, position)
    gap = float(scores.max() - scores[token])
    tol = tolerance(ar.decode, float(abs(scores.max())))
    exact_mode = bool(ar.decode.get("batch_invariant", False))
    return (NEAR_TIE if gap <= tol and not exact_mode else REAL), gap, tol


def verdict(summary: dict, label: str) -> str:
    """One sentence on whether a speculative run (label: "DDTree", "chain") emitted exactly the AR tokens and, if
    not, where, and which kind of divergence it was."""
    term, div = summary["exactness"], summary["first_divergence"]
    if div is None:
        return f"{term}: {label} tokens == AR tokens"
    where = f"NOT {term}: {label} first diverges at position {div['position']} (AR {div['ar_token']}, {label} " \
            f"{div['token']})"
    if div["score_gap"] is None:
        return f"{where}: a {REAL} (the runs differ in length): a bug"
    size = f"AR scored it {div['score_gap']:.4g} below its pick, tolerance {div['tolerance']:.3g}"
    if div["kind"] == NEAR_TIE:
        return f"{where}: a {NEAR_TIE} ({size}); the texts differ from there, rerun with --batch-invariant " \
               "for bit-exact rows"
    return f"{where}: a {REAL.upper()} ({size}): a bug"
