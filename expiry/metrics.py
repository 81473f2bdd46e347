"""The expiry sweeper's state at scrape time: registered with the kernel's ``/metrics`` from
``expiry/apps.py`` as the ``database`` state source (a capped count over a partial index)."""

from __future__ import annotations

from datetime import datetime

from prometheus_client.core import GaugeMetricFamily

from expiry.selectors import expiry_stats


def expiry_gauges() -> list[GaugeMetricFamily]:
    stats = expiry_stats()
    last = stats["last_run"]
    pending = GaugeMetricFamily(
        "couponcenter_expiry_pending_due",
        f"Due expiry tasks not yet processed (counted up to {stats['pending_due_capped_at']})",
    )
    pending.add_metric([], stats["pending_due"])
    lag = GaugeMetricFamily(
        "couponcenter_expiry_lag_seconds", "Age of the oldest due, unprocessed expiry task"
    )
    lag.add_metric([], stats["lag_seconds"])
    rate = GaugeMetricFamily(
        "couponcenter_expiry_last_rate_per_second", "Tasks per second of the last sweeper pass"
    )
    rate.add_metric([], float(last.get("per_s") or 0))
    finished = GaugeMetricFamily(
        "couponcenter_expiry_last_run_timestamp_seconds", "When the last sweeper pass ended"
    )
    if last.get("finished_at"):
        finished.add_metric([], datetime.fromisoformat(last["finished_at"]).timestamp())
    return [pending, lag, rate, finished]
