"""Lateness figures of the benchmarks, from an HDR histogram (the ``hdrhistogram`` package).

Samples are milliseconds; the histogram keeps microseconds with three significant digits from
1 µs to an hour, so p99.9 and max of a 200,000-sample burst are exact to 0.1 %, not the edge of
a coarse bucket. Early samples (negative lateness) count as 0: a reminder shown before its due
time would be a bug the tests catch, not a figure.
"""

from __future__ import annotations

from collections.abc import Iterable

from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # an hour
DIGITS = 3
PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p999", 99.9))


def lateness_summary(samples_ms: Iterable[float], *, prefix: str) -> dict[str, float | int | None]:
    """``{prefix}_p50_ms``, ``_p99_ms``, ``_p999_ms``, ``_max_ms`` and ``_samples``."""
    histogram = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)
    count = 0
    for sample in samples_ms:
        histogram.record_value(min(HIGHEST_US, max(LOWEST_US, round(sample * 1000))))
        count += 1
    result: dict[str, float | int | None] = {f"{prefix}_samples": count}
    for name, percentile in PERCENTILES:
        value = histogram.get_value_at_percentile(percentile) if count else None
        result[f"{prefix}_{name}_ms"] = None if value is None else round(value / 1000, 1)
    result[f"{prefix}_max_ms"] = round(histogram.get_max_value() / 1000, 1) if count else None
    return result
