"""The one percentile that benches, tunes and reports use, so that they agree."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest rank: the smallest sample with `pct` % of them at or under it (NaN when
    there are none). It is the reading an SLO needs: "p99 <= X" holds exactly when at
    most 1 % of the samples are over X."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]
