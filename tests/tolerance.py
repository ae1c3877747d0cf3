"""Float32 comparisons at the scale of the values compared.

A float32 forward through a few layers of norms and residuals rounds every logit by a small multiple of the
largest logit's ulp, whatever the logit's own size, so an element-wise relative tolerance fails on logits near
zero while an absolute one must be retuned for every model. These checks bound the largest error by a fraction of
the largest magnitude; a wrong computation misses by O(1) of it.
"""
from __future__ import annotations

import numpy as np


def assert_close_at_scale(actual, desired, tol: float, msg: str = "") -> None:
    """max |actual - desired| <= tol * max |desired| (arrays or tensors of one shape)."""
    actual, desired = np.asarray(actual, dtype=np.float64), np.asarray(desired, dtype=np.float64)
    assert actual.shape == desired.shape, f"shape {actual.shape}, expected {desired.shape} {msg}"
    error, scale = float(np.abs(actual - desired).max()), float(np.abs(desired).max())
    worst = np.unravel_index(np.abs(actual - desired).argmax(), actual.shape)
    assert error <= tol * scale, (f"largest error {error:.3g} at {tuple(int(i) for i in worst)} is over {tol:g} of "
                                  f"the largest magnitude {scale:.3g} {msg}")
