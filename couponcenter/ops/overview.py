"""The operations console's overview: the one read that spans every app.

The reminder engine's backlog, throughput and workers come from ``reminders.selectors.queues``,
the sweeper's figures from ``expiry.selectors``, the urgent paths and the background work held
back for them from ``couponcenter.core.urgency`` and ``.holdback``. Nothing
here writes; every read is bounded (see the selectors it calls).
"""

from __future__ import annotations

from datetime import UTC, datetime

from couponcenter.core.holdback import holdback_rows
from couponcenter.core.humanize import ms_age
from couponcenter.core.lockout import lockouts_now
from couponcenter.core.urgency import urgency_now
from couponcenter.ops.charts import duration_label
from expiry import selectors as expiry_selectors
from reminders import metrics
from reminders.engine.clock import epoch_ms
from reminders.members import is_reminder_topic
from reminders.models import ReminderSettings
from reminders.selectors import reminder_settings_get
from reminders.selectors.queues import (
    DUE_SOON_STEP_MIN,
    RECENT_MINUTES,
    Backlog,
    backlog,
    due_soon,
    recent_lateness,
    throughput,
    timeout_topic_rows,
    workers,
)
from reminders.selectors.quotas import quota_near_limit

# The charts' ranges: (minutes shown, seconds per point).
RANGES = {"5m": (5, 60), "1h": (60, 60), "24h": (24 * 60, 3600)}
DEFAULT_RANGE = "1h"


def lateness_text(ms: int | None) -> str:
    """A lateness percentile as read: past the histogram's last edge only "> 10 min" is known."""
    if metrics.past_buckets(ms):
        return f"> {duration_label(metrics.OPEN_FROM_MS)}"
    return ms_age(ms)


# --- the overview page ---------------------------------------------------------------------------


def warnings(*, data: Backlog, p99_ms: int | None, live: ReminderSettings) -> list[str]:
    out = []
    overdue = data.totals["due"]
    if overdue > live.backlog_warning:
        out.append(
            f"Overdue backlog is {overdue:,} entries (warning threshold {live.backlog_warning:,})."
        )
    if p99_ms is not None and p99_ms > live.lateness_warning_ms:
        out.append(
            f"p99 delivery lateness is {lateness_text(p99_ms)} over the last "
            f"{RECENT_MINUTES} minutes "
            f"(warning threshold {ms_age(live.lateness_warning_ms)})."
        )
    return out


def lockouts() -> list[dict]:
    """Sign-ins locked out now (django-axes, counted as ``couponcenter.core.lockout`` does)."""
    return lockouts_now(limit=50)


def urgent_paths() -> list[dict]:
    """Each urgent path's signal now against its target, and since when it is behind
    (``couponcenter.core.urgency``: read here as a background job would read it)."""
    reading = urgency_now()
    since = {b.path: b.since_ms for b in reading.behind}
    return [
        {
            "path": r.path,
            "value_ms": r.value_ms,
            "target_ms": r.target_ms,
            "behind": r.behind,
            "since": _moment(since.get(r.path)),
        }
        for r in reading.readings
    ]


def _moment(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def overview(chart_range: str = DEFAULT_RANGE) -> dict:
    """Everything the overview page shows, read once; the charts over ``chart_range`` (a key of
    ``RANGES``), the tables over the last hour."""
    minutes, step_s = RANGES[chart_range]
    live = reminder_settings_get(max_age_s=0)
    at_ms = epoch_ms()
    data = backlog(at_ms=at_ms)
    series = throughput()
    if step_s == 60:
        chart_series = {topic: rows[-minutes:] for topic, rows in series.items()}
    else:
        chart_series = throughput(minutes=minutes, step_s=step_s)
    lateness = recent_lateness({t: rows for t, rows in series.items() if is_reminder_topic(t)})
    p99 = lateness.p99_ms
    expiry = expiry_selectors.expiry_stats()
    return {
        "settings": live,
        "backlog": data,
        "series": chart_series,
        "chart_range": chart_range,
        "chart_step_s": step_s,
        "lateness": lateness,
        "p99_ms": p99,
        "workers": workers(at_ms=at_ms, live=live),
        "expiry": expiry,
        "warnings": warnings(data=data, p99_ms=p99, live=live),
        "lockouts": lockouts(),
        "urgent_paths": urgent_paths(),
        "holdbacks": holdback_rows(),
        "quota_near": quota_near_limit(live=live),
        "timeout_topics": timeout_topic_rows(data=data, series=series, at_ms=at_ms),
        "due_soon": due_soon(at_ms=at_ms),
        "due_soon_labels": [
            f"{i * DUE_SOON_STEP_MIN}-{(i + 1) * DUE_SOON_STEP_MIN} min" for i in range(6)
        ],
    }
