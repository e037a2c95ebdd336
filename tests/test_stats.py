"""The one percentile of benches and tunes: nearest rank, as an SLO reads it."""

from __future__ import annotations

import math

from bench.common import percentile_ms
from common.stats import percentile


def test_nearest_rank_is_the_smallest_sample_with_pct_at_or_under_it() -> None:
    hundred = [float(i) for i in range(100, 0, -1)]  # unordered on purpose
    assert percentile(hundred, 99) == 99.0  # one sample (100) is over it: 1 %
    assert percentile(hundred, 100) == 100.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_the_benches_read_the_same_percentile_in_milliseconds() -> None:
    seconds = [0.010, 0.020, 0.030, 0.500]
    assert percentile_ms(seconds, 75) == 30.0
    assert percentile_ms(seconds, 99) == 500.0
