"""The reminders' and timeouts' readings for the urgency signal (``couponcenter.core.urgency``,
docs/operations.md): per path, how long the oldest due job has waited unclaimed.

That age is the lateness the next job to be claimed will have at least: it grows at once when
the workers fall behind (or when delivery is, since claiming pauses while the Celery delivery
queue is full), and falls back as soon as they catch up. The lateness histograms of
``reminders.metrics`` say the same a minute later (they count what was delivered), so they are
the console's, not the signal's. A paused topic waits on purpose: it is left out.

Cost: one pipeline of two ``ZRANGE 0 0`` per slot and topic (``queue.earliest_due``), at most
once per ``URGENCY_CACHE_MS`` per process.
"""

from __future__ import annotations

from django.conf import settings

from couponcenter.core.urgency import Reading
from reminders.engine import queue
from reminders.members import is_reminder_topic
from reminders.selectors import reminder_settings_get
from reminders.selectors.queues import topic_slot_counts
from reminders.selectors.timeout_topics import timeout_topic_specs

REMINDERS, TIMEOUTS = "reminders", "timeouts"


def queue_readings(now_ms: int) -> list[Reading]:
    """The reminders' and the timeouts' oldest unclaimed due job's age (0: none due)."""
    live = reminder_settings_get()
    paused = {name for name, spec in timeout_topic_specs().items() if spec.paused}
    oldest = {REMINDERS: 0, TIMEOUTS: 0}
    for topic, slots in topic_slot_counts(live=live).items():
        path = REMINDERS if is_reminder_topic(topic) else TIMEOUTS
        if (live.paused and path == REMINDERS) or topic in paused:
            continue
        head = queue.earliest_due(topic, range(slots))
        if head is not None:
            oldest[path] = max(oldest[path], now_ms - head)
    return [
        Reading(REMINDERS, oldest[REMINDERS], settings.URGENT_REMINDERS_TARGET_MS),
        Reading(TIMEOUTS, oldest[TIMEOUTS], settings.URGENT_TIMEOUTS_TARGET_MS),
    ]
