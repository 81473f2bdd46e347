"""A benchmark's own Redis namespace and delivery queue, and its rows deleted before and after."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator

from django.conf import settings

from couponcenter.core.redis import broker_queue_delete
from reminders.bench.tables import delete_keys


@contextlib.contextmanager
def bench_namespace(
    cleanup: Callable[[], None], say: Callable[[str], None]
) -> Iterator[tuple[str, str]]:
    """Yield (key prefix, delivery queue), both new, with this process's settings pointing at
    them; ``cleanup`` deletes the run's rows first (a killed run left its own) and last, and the
    keys and the delivery queue go afterwards."""
    prefix = f"ccbench-{uuid.uuid4().hex[:8]}"
    delivery_queue = f"bench-{uuid.uuid4().hex[:8]}"
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
        settings.REDIS_KEY_PREFIX, settings.DELIVERY_QUEUE = saved
