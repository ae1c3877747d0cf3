"""Token equality that allows for float rounding: two float32 decodes of random inputs may part at a near tie.

The tree verify and the AR step run the same forward over different row counts, so their float32 logits differ
in the last bits (up to 4e-5 on the tiny model, measured over 200 random prompts). Where the reference's top two
logits are closer than that, either token is a correct greedy choice. These checks accept a divergence only
there: a wrong kernel or a wrong accept lands on a token well below the reference's best and fails.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.config import DecodeConfig
from engine.decoding.sampling import filtered_logits, uniforms
from engine.records import RunRecord

FLOAT32_NEAR_TIE = 1e-3  # 25x the largest float32 AR-vs-DDTree logit difference measured


def assert_greedy_equal(expected: Sequence[int], expected_logits: np.ndarray, actual: Sequence[int],
                        tolerance: float = FLOAT32_NEAR_TIE) -> None:
    """actual == expected, or they agree up to a position where expected_logits [n, V] (the logits that chose
    expected) rate actual's token within FLOAT32_NEAR_TIE of the best; past that point the two decodes
    continue different sequences and are not compared."""
    expected, actual = list(expected), list(actual)
    assert len(actual) == len(expected), f"{len(actual)} tokens, expected {len(expected)}"
    split = next((i for i, (e, a) in enumerate(zip(expected, actual, strict=True)) if e != a), None)
    if split is None:
        return
    row = np.asarray(expected_logits[split], dtype=np.float64)
    shortfall = row.max() - row[actual[split]]
    assert shortfall < tolerance, (
        f"token {split}: {actual[split]} where the reference chose {expected[split]}, {shortfall:.3g} below "
        f"its best logit (a near tie is < {tolerance:.3g}); tokens {actual} vs {expected}")


def assert_sampled_equal(ar: RunRecord, actual: Sequence[int], cfg: DecodeConfig) -> None:
    """As assert_greedy_equal for a sampled decode: AR's pick at each position is the argmax of its filtered
    logits / T plus the position's keyed Gumbel noise, so those scores are what a near tie is measured on (a
    logit difference shrinks by 1 / T in them)."""
    if cfg.temperature == 0.0:
        assert_greedy_equal(ar.tokens, ar.logits, actual)
        return
    logits = torch.from_numpy(np.asarray(ar.logits, dtype=np.float32))
    positions = len(ar.prompt) + torch.arange(len(ar.tokens))
    scores = filtered_logits(logits, cfg) - torch.log(-torch.log(uniforms(cfg.seed, positions, logits.shape[1])))
    assert scores.argmax(-1).tolist() == ar.tokens, "the scores reproduce AR's own picks"
    assert_greedy_equal(ar.tokens, scores.numpy(), actual, FLOAT32_NEAR_TIE / cfg.temperature)
