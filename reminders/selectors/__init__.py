"""Reads of the reminders app."""

from __future__ import annotations

from couponcenter.core.live_settings import LiveSettingsReader
from reminders.models import Notification, ReminderSettings, ReminderSubscription, TimeoutJob

# Workers read the settings every tick; the marker is checked at most this often per process.
SETTINGS_MAX_AGE_S = 0.5
_settings = LiveSettingsReader(ReminderSettings, max_age_s=SETTINGS_MAX_AGE_S)


def reminder_settings_get(*, fresh: bool = False) -> ReminderSettings:
    """The live settings row; ``fresh``: check its change marker now."""
    return _settings.get(max_age_s=0 if fresh else None)


def reminder_settings_forget() -> None:
    """Drop the cached row (after a save, so this process reads the new one at once)."""
    _settings.clear()


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


def subscription_scheduled_count(*, coupon_id: int) -> int:
    """Scheduled reminders of one coupon (for its change page, never per row of a list)."""
    return ReminderSubscription.objects.filter(
        coupon_id=coupon_id, status=ReminderSubscription.Status.SCHEDULED
    ).count()
