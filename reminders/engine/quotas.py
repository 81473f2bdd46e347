"""Tenant quotas kept in Redis, so they hold across every web process and spread over a Redis
Cluster (one key, and hash tag, per owner or topic):

- creations per second per owner: a leaky bucket (``lua/quota_take.lua``); an owner whose bucket
  fills past a mark is noted in one sorted set the console reads;
- pending jobs per topic: a count taken from the database, kept for a while and raised by each
  creation admitted meanwhile (``lua/quota_pending.lua``), so a create does not count the
  topic's jobs again.
"""

from __future__ import annotations

from typing import NamedTuple

from . import connection, keys, scripts
from .connection import Client

# Owners noted near their limit are kept this long (the console shows the last minute).
NEAR_KEEP_MS = 60_000
PENDING_ADMITTED, PENDING_REFUSED, PENDING_UNCOUNTED = 0, 1, 2  # quota_pending.lua's codes


class Taken(NamedTuple):
    wait_ms: int  # 0: taken; else how long until the request would fit
    level: int  # creations not yet drained (after the take, or as it is when refused)


def take(
    owner: str, limit_per_s: int, n: int, *, now_ms: int, client: Client | None = None
) -> Taken:
    """Take ``n`` creations from ``owner``'s bucket (draining at ``limit_per_s``), or none."""
    wait_ms, level = scripts.QUOTA_TAKE(
        connection.client(client), [keys.quota_bucket(owner)], [limit_per_s, now_ms, n]
    )
    return Taken(int(wait_ms), int(level))


def pending_take(
    topic: str,
    limit: int,
    n: int,
    *,
    keep_ms: int,
    counted: int | None = None,
    client: Client | None = None,
) -> Taken | None:
    """Raise ``topic``'s pending count by ``n`` if it stays within ``limit`` (a negative ``n``
    gives back). ``Taken(0, count after)`` when admitted, ``Taken(ms until the count is taken
    again, 0)`` when refused, None when no count is kept: take one from the database and call
    again with it (``counted``), to be kept ``keep_ms``."""
    code, value = scripts.QUOTA_PENDING(
        connection.client(client),
        [keys.quota_pending(topic)],
        [limit, n, "" if counted is None else counted, keep_ms],
    )
    if int(code) == PENDING_UNCOUNTED:
        return None
    return Taken(0, int(value)) if int(code) == PENDING_ADMITTED else Taken(int(value), 0)


def pending_counts(topics: list[str], *, client: Client | None = None) -> dict[str, int | None]:
    """Each topic's kept pending count (None: none kept now), in one pipeline."""
    pipe = scripts.pipeline(connection.client(client))
    for topic in topics:
        pipe.get(keys.quota_pending(topic))
    return {t: None if v is None else int(v) for t, v in zip(topics, pipe.execute(), strict=True)}


def note_near(owner: str, *, now_ms: int, client: Client | None = None) -> None:
    """Record that ``owner`` is near its limit now, forgetting notes older than ``NEAR_KEEP_MS``."""
    pipe = scripts.pipeline(connection.client(client))
    pipe.zadd(keys.quota_near(), {owner: now_ms})
    pipe.zremrangebyscore(keys.quota_near(), "-inf", now_ms - NEAR_KEEP_MS)
    pipe.execute()


def near(*, now_ms: int, limit: int, client: Client | None = None) -> list[tuple[str, int]]:
    """Owners noted within ``NEAR_KEEP_MS`` of ``now_ms``, latest first: ``(owner, at_ms)``."""
    rows = connection.client(client).zrevrangebyscore(
        keys.quota_near(), "+inf", now_ms - NEAR_KEEP_MS, start=0, num=limit, withscores=True
    )
    return [(scripts.as_str(owner), int(at)) for owner, at in rows]


def levels(
    owners: list[str], *, limit_per_s: int, now_ms: int, client: Client | None = None
) -> dict[str, int]:
    """Each owner's bucket level drained to ``now_ms`` (read only: nothing is taken)."""
    pipe = scripts.pipeline(connection.client(client))
    for owner in owners:
        pipe.hmget(keys.quota_bucket(owner), ["level", "ms"])
    out = {}
    for owner, (level, at) in zip(owners, pipe.execute(), strict=True):
        if level is None or at is None:
            out[owner] = 0
            continue
        drained = max(0.0, now_ms - float(at)) * limit_per_s / 1000
        out[owner] = int(max(0.0, float(level) - drained))
    return out
