"""Live configuration writes: every change bumps ``ReminderSettings.version`` (the marker workers
poll, as django-celery-beat's "changed at" row) and records a new slot layout, so entries indexed
under the old slot count stay served until drained."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from reminders.engine import queue
from reminders.models import ReminderSettings
from reminders.topics import REMINDER_TOPICS


def reminder_settings_save(*, instance: ReminderSettings) -> ReminderSettings:
    instance.full_clean()
    with transaction.atomic():
        if instance.pk is None and ReminderSettings.objects.exists():
            raise ValueError("there is only one ReminderSettings row; change it instead")
        instance.save()
        ReminderSettings.objects.filter(pk=instance.pk).update(version=F("version") + 1)
        instance.refresh_from_db()
        slots = instance.slots
        transaction.on_commit(
            lambda: [queue.record_layout(topic, slots) for topic in REMINDER_TOPICS]
        )
    from reminders import selectors

    selectors.reminder_settings_get(fresh=True)
    return instance
