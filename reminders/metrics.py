"""Counters and lateness kept for the console, in Redis with bounded memory, plus Prometheus:
the reminder events and lateness counters (the queue gauges read at scrape time are
``reminders.collector``).

Per topic and minute, one hash ``<prefix>:metrics:{<topic>}:<minute>`` holds counts (dispatched,
delivered, failed, dropped, dead, orphaned: entries the reconcile removed, capped and digested:
the per-user push cap's) and a lateness
histogram (``lat:<bucket upper bound ms>``); the same counts go to one hash per hour
(``...:h<hour>``) for the console's 24-hour view. Minute hashes expire after ``RETENTION_S``, hour
hashes after ``HOUR_RETENTION_S``, so memory is bounded by topics x periods kept.

Percentiles are interpolated linearly inside the histogram bucket they fall in
(``percentile``); ``bucket_bounds`` says how precise that is (the bucket's edges).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping

from django.conf import settings
from prometheus_client import Counter, Histogram

from couponcenter.core.redis import get_redis

RETENTION_S = 2 * 3600
HOUR_RETENTION_S = 25 * 3600
# Gauges sampled into the same hashes (the last sample of a period stands for it): how many jobs
# were scheduled and how many of those overdue, so a queue page can draw its backlog over time.
GAUGES = ("backlog", "overdue")
COUNTS = ("dispatched", "delivered", "failed", "dropped", "dead", "orphaned", "capped", "digested")
# Upper bounds (ms) of the lateness buckets; the last one catches everything later. Fine enough
# that a bucket's width is at most about half its upper edge above 1 s (a p99 of 47 s reads
# 45-60 s, never "60,000 ms").
LATENESS_BUCKETS_MS = (
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10_000,
    20_000,
    30_000,
    45_000,
    60_000,
    120_000,
    300_000,
    600_000,
    10**12,
)
# The last closed edge: a lateness past it is only known to be past it.
OPEN_FROM_MS = LATENESS_BUCKETS_MS[-2]

EVENTS = Counter("couponcenter_reminder_events_total", "Reminder events", ["topic", "event"])
LATENESS = Histogram(
    "couponcenter_delivery_lateness_seconds",
    "Delivered minus due time",
    ["topic"],
    buckets=[b / 1000 for b in LATENESS_BUCKETS_MS[:-1]],
)


def _key(topic: str, minute: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:metrics:{{{topic}}}:{minute}"


def _hour_key(topic: str, hour: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:metrics:{{{topic}}}:h{hour}"


def bucket_for(lateness_ms: float) -> int:
    return LATENESS_BUCKETS_MS[
        min(bisect_left(LATENESS_BUCKETS_MS, lateness_ms), len(LATENESS_BUCKETS_MS) - 1)
    ]


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
    key, hour_key = _key(topic, int(now // 60)), _hour_key(topic, int(now // 3600))
    pipe = get_redis().pipeline(transaction=False)
    for name, n in fields.items():
        pipe.hincrby(key, name, n)
        pipe.hincrby(hour_key, name, n)
    pipe.expire(key, RETENTION_S)
    pipe.expire(hour_key, HOUR_RETENTION_S)
    pipe.execute()


def sample_backlog(topic: str, *, backlog: int, overdue: int, now: float | None = None) -> None:
    """Note the topic's backlog now in this minute's and this hour's hashes (one round trip)."""
    now = time.time() if now is None else now
    fields = {"backlog": backlog, "overdue": overdue}
    key, hour_key = _key(topic, int(now // 60)), _hour_key(topic, int(now // 3600))
    pipe = get_redis().pipeline(transaction=False)
    for k, ttl in ((key, RETENTION_S), (hour_key, HOUR_RETENTION_S)):
        pipe.hset(k, mapping=fields)
        pipe.expire(k, ttl)
    pipe.execute()


def series(
    topic: str, *, minutes: int = 60, now: float | None = None, step_s: int = 60
) -> list[dict]:
    """Per period (a minute, or an hour with ``step_s=3600``), oldest first, covering the last
    ``minutes``: counts, the lateness histogram (``hist``: bucket upper bound ms -> count) and its
    interpolated p50/p99 (ms)."""
    if step_s not in (60, 3600):
        raise ValueError("step_s is 60 or 3600")
    now = time.time() if now is None else now
    last = int(now // step_s)
    periods = max(1, -(-minutes * 60 // step_s))
    wanted = list(range(last - periods + 1, last + 1))
    key = _key if step_s == 60 else _hour_key
    pipe = get_redis().pipeline(transaction=False)
    for period in wanted:
        pipe.hgetall(key(topic, period))
    rows = []
    for period, raw in zip(wanted, pipe.execute(), strict=True):
        data = {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}
        hist = {int(k[4:]): v for k, v in data.items() if k.startswith("lat:")}
        rows.append(
            {
                "minute": period * step_s,
                **{name: data.get(name, 0) for name in COUNTS},
                **{name: data.get(name) for name in GAUGES},  # None: not sampled then
                "hist": hist,
                "lateness_p50_ms": percentile(hist, 0.50),
                "lateness_p99_ms": percentile(hist, 0.99),
                "lateness_count": sum(hist.values()),
            }
        )
    return rows


def merged(rows: Iterable[Mapping]) -> dict[int, int]:
    """The lateness histograms of ``rows`` (from ``series``) added up: a window's percentiles
    come from its samples together, not from the worst of its minutes."""
    total: dict[int, int] = {}
    for row in rows:
        for bound, n in row.get("hist", {}).items():
            total[bound] = total.get(bound, 0) + n
    return total


def bucket_bounds(upper_ms: float) -> tuple[int, int]:
    """The (lower, upper) edges in ms of the bucket a value falls in."""
    index = min(bisect_left(LATENESS_BUCKETS_MS, upper_ms), len(LATENESS_BUCKETS_MS) - 1)
    return (LATENESS_BUCKETS_MS[index - 1] if index else 0), LATENESS_BUCKETS_MS[index]


def percentile(hist: Mapping[int, int], q: float) -> int | None:
    """The ``q`` quantile in ms, interpolated linearly inside its bucket (samples taken as spread
        evenly over it); the open last bucket answers one past its lower edge (``OPEN_FROM_MS + 1``:
    later than that edge, by how much no bucket says). None without samples."""
    total = sum(hist.values())
    if not total:
        return None
    rank, seen = q * total, 0
    for bound in sorted(hist):
        n = hist[bound]
        if n and seen + n >= rank:
            low, high = bucket_bounds(bound)
            if high != bound:  # a bound from an older bucket layout: no interpolation
                return bound
            if bound == LATENESS_BUCKETS_MS[-1]:
                return low + 1
            return round(low + (high - low) * max(rank - seen, 0) / n)
        seen += n
    return max(hist)


def past_buckets(lateness_ms: int | None) -> bool:
    """Whether a lateness (from ``percentile``) lies in the open last bucket."""
    return lateness_ms is not None and lateness_ms > OPEN_FROM_MS


def count(topic: str, name: str, *, minutes: int = 60, now: float | None = None) -> int:
    """One count summed over the last ``minutes`` minutes: one ``HGET`` per minute in one round
    trip, nothing else read or parsed (a benchmark polls it every few milliseconds while the
    work it watches shares the cores)."""
    now = time.time() if now is None else now
    last = int(now // 60)
    pipe = get_redis().pipeline(transaction=False)
    for minute in range(last - minutes + 1, last + 1):
        pipe.hget(_key(topic, minute), name)
    return sum(int(n) for n in pipe.execute() if n is not None)


def totals(topic: str, *, minutes: int = 60, now: float | None = None) -> dict[str, int]:
    """Counts summed over the last ``minutes`` minutes."""
    out = dict.fromkeys(COUNTS, 0)
    for row in series(topic, minutes=minutes, now=now):
        for name in COUNTS:
            out[name] += row[name]
    return out
