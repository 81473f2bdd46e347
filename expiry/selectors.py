"""Reads for the expiry console: backlog, oldest due task, the last sweeper pass.

The last pass lives in Redis (a hash at ``services.last_run_key()``, written by every sweeper
after each pass), not in the database: it changes every minute per sweeper and is worthless after
a restart, so it does not deserve a row update in PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime

import redis
from django.utils import timezone

from couponcenter.core.redis import get_redis

from .models import ExpiryTask
from .services import last_run_key

# Counting a backlog of tens of millions would scan them all: counts stop here ("at least").
COUNT_CAP = 1_000_000


def pending_due_count(*, now: datetime | None = None, cap: int = COUNT_CAP) -> int:
    """Due pending tasks, counted up to ``cap`` (a LIMITed subquery over the partial index)."""
    now = now or timezone.now()
    return ExpiryTask.objects.filter(status=ExpiryTask.Status.PENDING, expire_at__lte=now)[
        :cap
    ].count()


def oldest_due_task(*, now: datetime | None = None) -> ExpiryTask | None:
    """The due pending task that has waited longest (how far behind the sweepers are)."""
    now = now or timezone.now()
    return (
        ExpiryTask.objects.filter(status=ExpiryTask.Status.PENDING, expire_at__lte=now)
        .order_by("expire_at")
        .first()
    )


def last_run() -> dict[str, str]:
    """The latest pass of any sweeper, as stored in Redis ({} if none yet or Redis is down)."""
    try:
        raw = get_redis().hgetall(last_run_key())
    except redis.RedisError:
        return {}
    return {_text(k): _text(v) for k, v in raw.items()}


def expiry_stats(*, now: datetime | None = None) -> dict:
    """Everything the console shows about the sweeper, in one dict."""
    now = now or timezone.now()
    oldest = oldest_due_task(now=now)
    return {
        "pending_due": pending_due_count(now=now),
        "pending_due_capped_at": COUNT_CAP,
        "oldest_due_at": oldest.expire_at if oldest else None,
        "lag_seconds": (now - oldest.expire_at).total_seconds() if oldest else 0.0,
        "last_run": last_run(),
    }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
