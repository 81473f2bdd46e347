"""The Celery ETA peer's task (``bench_peers``): a no-op that records its lateness in Redis.

Only the benchmark's Celery worker loads it (``--include reminders.bench.peer_tasks``)."""

from __future__ import annotations

import time

from celery import shared_task

from couponcenter.core.redis import get_redis


@shared_task(name="ccpeer.record_lateness", ignore_result=True)
def record_lateness(key: str, due_ms: int) -> None:
    now_ms = time.time() * 1000
    pipe = get_redis().pipeline(transaction=False)
    pipe.rpush(key, round(now_ms - due_ms, 1))
    pipe.set(f"{key}:last", now_ms)
    pipe.execute()
