"""Live configuration writes: every change moves ``ReminderSettings.version`` (the marker workers
poll, ``couponcenter.core.live_settings``) and records a new slot layout, so entries indexed under
the old slot count stay served until drained."""

from __future__ import annotations

from django.db import transaction

from couponcenter.core.live_settings import live_settings_save, live_settings_touch
from reminders import selectors
from reminders.engine import queue
from reminders.members import REMINDER_TOPICS
from reminders.models import ReminderSettings


def reminder_settings_save(*, instance: ReminderSettings) -> ReminderSettings:
    with transaction.atomic():
        live_settings_save(instance=instance)
        slots = instance.slots
        transaction.on_commit(
            lambda: [queue.record_layout(topic, slots) for topic in REMINDER_TOPICS]
        )
    selectors.reminder_settings_cache_clear()
    return instance


def reminder_settings_touch() -> None:
    """In the transaction of a write to the reminders' live configuration kept in other tables
    (the timeout topics, ``selectors.timeout_topics``): moves the settings row's change marker
    with it, so no process validates a request against what it kept from before."""
    live_settings_touch(model=ReminderSettings)
