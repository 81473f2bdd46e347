"""Live configuration writes: every change moves ``ReminderSettings.version`` (the marker workers
poll, ``couponcenter.core.live_settings``) and records a new slot layout, so entries indexed under
the old slot count stay served until drained."""

from __future__ import annotations

from django.db import transaction

from couponcenter.core.live_settings import live_settings_save, live_settings_touch
from reminders import selectors
from reminders.models import ReminderSettings
from reminders.services.indexing import layouts_record_on_commit


def reminder_settings_save(*, instance: ReminderSettings) -> ReminderSettings:
    with transaction.atomic():
        live_settings_save(instance=instance)
        slots = instance.slots
        layouts_record_on_commit(slots)
    selectors.reminder_settings_cache_clear()
    return instance


def reminder_settings_touch() -> None:
    """In the transaction of a write to the reminders' live configuration kept in other tables
    (the timeout topics, ``selectors.timeout_topics``): moves the settings row's change marker
    with it, so no process validates a request against what it kept from before."""
    live_settings_touch(model=ReminderSettings)
