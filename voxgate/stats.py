"""Statistics shared by the product's reports and the measuring harness (one definition)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100, numpy's default method); None for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None
