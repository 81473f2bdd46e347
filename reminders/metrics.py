"""Counters and lateness kept for the console, in Redis with bounded memory, plus Prometheus:
the reminder events and lateness counters (the queue gauges read at scrape time are
``reminders.collector``).

Per topic and minute, one hash ``<prefix>:metrics:{<topic>}:<minute>`` holds counts (dispatched,
delivered, failed, dropped, dead, and orphaned: entries the reconcile removed) and a lateness
histogram (``lat:<bucket upper bound ms>``). Each hash expires after ``RETENTION_S``, so memory is
bounded by topics x minutes kept.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping

from django.conf import settings
from prometheus_client import Counter, Histogram

from couponcenter.core.redis import get_redis

RETENTION_S = 2 * 3600
COUNTS = ("dispatched", "delivered", "failed", "dropped", "dead", "orphaned")
# Upper bounds (ms) of the lateness buckets; the last one catches everything later.
LATENESS_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 60_000, 10**12)

EVENTS = Counter("couponcenter_reminder_events_total", "Reminder events", ["topic", "event"])
LATENESS = Histogram(
    "couponcenter_delivery_lateness_seconds",
    "Delivered minus due time",
    ["topic"],
    buckets=[b / 1000 for b in LATENESS_BUCKETS_MS[:-1]],
)


def _key(topic: str, minute: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:metrics:{{{topic}}}:{minute}"


def bucket_for(lateness_ms: float) -> int:
    return LATENESS_BUCKETS_MS[min(bisect_left(LATENESS_BUCKETS_MS, lateness_ms),
                                   len(LATENESS_BUCKETS_MS) - 1)]  # fmt: skip


def _observe_many(topic: str, hist: Mapping[int, int], total_ms: float) -> None:
    """Add a whole batch's samples to the Prometheus histogram at once (one ``inc`` per bucket
    instead of one ``observe`` per sample: a burst delivers 200,000 of them)."""
    child = LATENESS.labels(topic)
    buckets = getattr(child, "_buckets", None)
    if buckets is None or len(buckets) != len(LATENESS_BUCKETS_MS):
        for bound, n in hist.items():  # an unexpected client version: the public API
            for _ in range(n):
                child.observe(bound / 1000)
        return
    for bound, n in hist.items():
        buckets[LATENESS_BUCKETS_MS.index(bound)].inc(n)
    child._sum.inc(max(total_ms, 0) / 1000)


def record(
    topic: str,
    counts: Mapping[str, int] | None = None,
    lateness_ms: Iterable[float] = (),
    *,
    now: float | None = None,
) -> None:
    """Add counts and lateness samples to this minute's hash (one round trip)."""
    now = time.time() if now is None else now
    fields: dict[str, int] = {}
    for name, n in (counts or {}).items():
        if n:
            fields[name] = fields.get(name, 0) + n
            EVENTS.labels(topic, name).inc(n)
    hist: dict[int, int] = {}
    total_ms = 0.0
    for sample in lateness_ms:
        bound = bucket_for(sample)
        hist[bound] = hist.get(bound, 0) + 1
        total_ms += sample
    if hist:
        _observe_many(topic, hist, total_ms)
        for bound, n in hist.items():
            fields[f"lat:{bound}"] = n
    if not fields:
        return
    key = _key(topic, int(now // 60))
    pipe = get_redis().pipeline(transaction=False)
    for name, n in fields.items():
        pipe.hincrby(key, name, n)
    pipe.expire(key, RETENTION_S)
    pipe.execute()


def series(topic: str, *, minutes: int = 60, now: float | None = None) -> list[dict]:
    """Per minute, oldest first: counts and lateness p50/p99 (ms, bucket upper bounds)."""
    now = time.time() if now is None else now
    last = int(now // 60)
    wanted = list(range(last - minutes + 1, last + 1))
    pipe = get_redis().pipeline(transaction=False)
    for minute in wanted:
        pipe.hgetall(_key(topic, minute))
    rows = []
    for minute, raw in zip(wanted, pipe.execute(), strict=True):
        data = {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}
        hist = {int(k[4:]): v for k, v in data.items() if k.startswith("lat:")}
        rows.append(
            {
                "minute": minute * 60,
                **{name: data.get(name, 0) for name in COUNTS},
                "lateness_p50_ms": percentile(hist, 0.50),
                "lateness_p99_ms": percentile(hist, 0.99),
                "lateness_count": sum(hist.values()),
            }
        )
    return rows


def percentile(hist: Mapping[int, int], q: float) -> int | None:
    total = sum(hist.values())
    if not total:
        return None
    rank, seen = q * total, 0
    for bound in sorted(hist):
        seen += hist[bound]
        if seen >= rank:
            return bound
    return max(hist)


def totals(topic: str, *, minutes: int = 60, now: float | None = None) -> dict[str, int]:
    """Counts summed over the last ``minutes`` minutes."""
    out = dict.fromkeys(COUNTS, 0)
    for row in series(topic, minutes=minutes, now=now):
        for name in COUNTS:
            out[name] += row[name]
    return out
