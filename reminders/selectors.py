"""Reads of the reminders app."""

from __future__ import annotations

import time

from reminders.models import Notification, ReminderSettings, ReminderSubscription, TimeoutJob

# Workers read the settings row every tick; a short cache keeps that one cheap query per second.
_SETTINGS_TTL_S = 0.5
_cached: tuple[float, ReminderSettings] | None = None


def reminder_settings_get(*, fresh: bool = False) -> ReminderSettings:
    global _cached
    now = time.monotonic()
    if not fresh and _cached is not None and now - _cached[0] < _SETTINGS_TTL_S:
        return _cached[1]
    row = ReminderSettings.objects.order_by("pk").first()
    if row is None:
        row, _ = ReminderSettings.objects.get_or_create(pk=1)
    _cached = (now, row)
    return row


def timeout_job_get(*, job_id: int) -> TimeoutJob:
    return TimeoutJob.objects.get(pk=job_id)


def subscription_list(*, user_id: int):
    return (
        ReminderSubscription.objects.filter(user_id=user_id)
        .select_related("coupon")
        .order_by("-created_at", "-id")
    )


def notification_list(*, user_id: int):
    return Notification.objects.filter(user_id=user_id).order_by("-created_at", "-id")
