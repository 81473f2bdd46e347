"""Tenant quotas on timeout jobs: what one owner may create.

The owner is the API account that sends the request; staff, and code calling the services
directly (workers, commands, benchmarks), have none. Its limits are live settings
(``ReminderSettings.quota_*``, 0: none), checked by the create paths before anything is written:

- attribute size (``attributes.size``, under the hard ``TIMEOUT_ATTRIBUTE_MAX_BYTES``): a job
  whose attribute is larger is bad input (``ValidationError``, 400): sending it again would not
  help;
- pending jobs per topic: the topic's pending jobs plus the new ones may not pass the limit (a
  topic is used by its owner, an account or a group's members, and staff: its limit is the
  owner's); the count is kept in Redis between two counts in the database
  (``PENDING_RECOUNT_MS``) and errs high, never low;
- creations per second: a leaky bucket per owner in Redis (``reminders.engine.quotas``).

The last two refuse with ``QuotaExceeded`` (429 with ``Retry-After``), the whole request at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError

from couponcenter.core.errors import QuotaExceeded
from reminders import attributes
from reminders.engine import quotas
from reminders.engine.clock import epoch_ms
from reminders.selectors import reminder_settings_get
from reminders.selectors.quotas import is_near, timeout_pending_count

# A topic's pending count is taken from the database at most this often (once for every web
# process): in between, each admitted creation raises it, and jobs that fired or were cancelled
# make room when it is taken again.
PENDING_RECOUNT_MS = 10_000


def quota_attributes_check(*, by_field: Iterable[tuple[str, dict[str, Any] | None]]) -> None:
    """``by_field``: (field name for the error, attribute). Raises ``ValidationError`` naming
    every attribute larger than ``quota_attribute_bytes``."""
    limit = reminder_settings_get().quota_attribute_bytes
    if not limit:
        return
    errors = {}
    for field, attribute in by_field:
        if attribute and (size := attributes.size(attribute)) > limit:
            errors[field] = [
                f"Too large: {size:,} bytes of JSON; this account's limit is {limit:,}."
            ]
    if errors:
        raise ValidationError(errors)


def quota_creations_take(*, owner_id: int, new_per_topic: dict[str, int]) -> None:
    """Admit ``new_per_topic`` (topic -> jobs about to be created) for ``owner_id``, or raise
    ``QuotaExceeded`` having taken nothing."""
    live = reminder_settings_get()
    limit, raised = live.quota_pending_per_topic, []
    try:
        for topic, n in sorted(new_per_topic.items()) if limit else ():
            wait_ms = _pending_take(topic, limit, n) if n <= limit else PENDING_RECOUNT_MS
            if wait_ms:
                raise QuotaExceeded(
                    quota="quota_pending_per_topic",
                    limit=limit,
                    retry_after_s=math.ceil(wait_ms / 1000),
                    message=f"Topic {topic} has no room for {n:,} more pending jobs (its "
                    f"limit: {limit:,}); try again once some have fired or been cancelled.",
                )
            raised.append((topic, n))
        _creations_take(str(owner_id), live.quota_creations_per_s, sum(new_per_topic.values()))
    except QuotaExceeded:
        for topic, n in raised:
            quotas.pending_take(topic, limit, -n, keep_ms=PENDING_RECOUNT_MS)
        raise


def _pending_take(topic: str, limit: int, n: int) -> int:
    """Raise the topic's pending count by ``n``: 0, or how long (ms) until it is taken again."""
    taken = quotas.pending_take(topic, limit, n, keep_ms=PENDING_RECOUNT_MS)
    while taken is None:  # no count kept: take one (another process may have just done so)
        counted = timeout_pending_count(topic=topic, at_most=limit + 1)
        taken = quotas.pending_take(topic, limit, n, keep_ms=PENDING_RECOUNT_MS, counted=counted)
    return taken.wait_ms


def _creations_take(owner: str, limit: int, n: int) -> None:
    if not limit or not n:
        return
    now = epoch_ms()
    taken = quotas.take(owner, limit, n, now_ms=now)
    if taken.wait_ms or is_near(taken.level, limit):
        quotas.note_near(owner, now_ms=now)
    if taken.wait_ms:
        raise QuotaExceeded(
            quota="quota_creations_per_s",
            limit=limit,
            retry_after_s=math.ceil(taken.wait_ms / 1000),
            message=f"Over this account's {limit:,} job creations per second"
            + (f" ({n:,} asked at once)." if n > 1 else "."),
        )
