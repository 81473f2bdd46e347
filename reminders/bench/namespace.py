"""A benchmark's own Redis namespace and delivery queue, and its rows deleted before and after."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

from django.conf import settings

from couponcenter.core.redis import broker_queue_delete
from reminders.bench import namespace_guard
from reminders.bench.tables import delete_keys


@contextlib.contextmanager
def bench_namespace(
    cleanup: Callable[[], None], say: Callable[[str], None]
) -> Iterator[tuple[str, str]]:
    """Yield (key prefix, delivery queue), both new, with this process's settings pointing at
    them; ``cleanup`` deletes the run's rows first (a killed run left its own) and last, and the
    keys and the delivery queue go afterwards, by ``namespace_guard`` if the run is killed
    outright."""
    prefix = f"ccbench-{uuid.uuid4().hex[:8]}"
    delivery_queue = f"bench-{uuid.uuid4().hex[:8]}"
    guard = _guard(prefix, delivery_queue)
    saved = settings.REDIS_KEY_PREFIX, settings.DELIVERY_QUEUE
    settings.REDIS_KEY_PREFIX, settings.DELIVERY_QUEUE = prefix, delivery_queue
    try:
        cleanup()
        yield prefix, delivery_queue
    finally:
        try:
            cleanup()
        except Exception as exc:  # the run's own error, if any, is the one to raise
            say(f"the bench rows were not all deleted ({exc}); the next run deletes them first")
        delete_keys(prefix)
        broker_queue_delete(delivery_queue)  # its consumers (the bench's processes) are gone
        guard.communicate(namespace_guard.DONE, timeout=30)
        settings.REDIS_KEY_PREFIX, settings.DELIVERY_QUEUE = saved


def _guard(prefix: str, delivery_queue: str) -> subprocess.Popen:
    """``namespace_guard`` for this run's keys and queue, on this process's Redis and broker."""
    env = {
        **os.environ,
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "couponcenter.settings"),
    }
    argv = [sys.executable, "-m", "reminders.bench.namespace_guard", prefix, delivery_queue]
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, env=env, cwd=settings.BASE_DIR, start_new_session=True
    )
