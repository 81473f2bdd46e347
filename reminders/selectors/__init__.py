"""Reads of the reminders app."""

from __future__ import annotations

from datetime import datetime

from django.db.models import TextField
from django.db.models.functions import Cast, Left, Length
from django.utils import timezone

from couponcenter.core.live_settings import LiveSettingsReader, Marker
from reminders.models import Notification, ReminderSettings, ReminderSubscription, TimeoutJob

# Workers read the settings every tick; the marker is checked at most this often per process (a
# request checks it once, after it began: ``couponcenter.core.live_settings``).
SETTINGS_MAX_AGE_S = 0.5
_settings = LiveSettingsReader(ReminderSettings, max_age_s=SETTINGS_MAX_AGE_S)


def reminder_settings_get(*, max_age_s: float | None = None) -> ReminderSettings:
    """The live settings row as of at most ``max_age_s`` seconds ago (default:
    ``SETTINGS_MAX_AGE_S``; 0: check its change marker now)."""
    return _settings.get(max_age_s=max_age_s)


def reminder_settings_marker() -> Marker:
    """The change marker of the reminders' live configuration: the settings row and what follows
    it (the timeout topics, ``selectors.timeout_topics``)."""
    return _settings.marker()


def reminder_settings_cache_clear() -> None:
    """Drop the cached row (after a write of it, so this process reads the new one at once)."""
    _settings.clear()


def reminder_settings_recheck() -> None:
    """Check the marker at the next read (after a write that moved it, e.g. a topic's), keeping
    the row: an invalid row found then still leaves the last good one in use."""
    _settings.recheck()


def timeout_job_attribute_text(*, job_id: int, max_chars: int) -> tuple[str, int]:
    """The job's attribute as its stored JSON text, at most ``max_chars`` of it, and the length of
    the whole text. Never decoded: a stored value nested deeper than Python's decoder can recurse
    is read too."""
    text = Cast("attribute", TextField())
    return (
        TimeoutJob.objects.filter(pk=job_id).values_list(Left(text, max_chars), Length(text)).get()
    )


def timeout_job_by_key(*, topic: str, biz_type: str, biz_id: str) -> TimeoutJob | None:
    """The key's live job (pending or running: at most one of each), else its latest one."""
    jobs = TimeoutJob.objects.filter(topic=topic, biz_type=biz_type, biz_id=biz_id)
    live = jobs.filter(status__in=(TimeoutJob.Status.PENDING, TimeoutJob.Status.RUNNING)).order_by(
        "status", "-pk"
    )  # pending first: that is the one a cancel or a move acts on
    return live.first() or jobs.order_by("-pk").first()


def timeout_job_list(
    *,
    topic: str | None = None,
    status: int | None = None,
    biz_type: str | None = None,
    action_time_after: datetime | None = None,
    action_time_before: datetime | None = None,
):
    jobs = TimeoutJob.objects.all()
    if topic is not None:
        jobs = jobs.filter(topic=topic)
    if status is not None:
        jobs = jobs.filter(status=status)
    if biz_type is not None:
        jobs = jobs.filter(biz_type=biz_type)
    if action_time_after is not None:
        jobs = jobs.filter(action_time__gte=action_time_after)
    if action_time_before is not None:
        jobs = jobs.filter(action_time__lt=action_time_before)
    return jobs


def subscription_list(*, user_id: int):
    return (
        ReminderSubscription.objects.filter(user_id=user_id)
        .select_related("coupon")
        .order_by("-created_at", "-id")
    )


def notification_list(*, user_id: int, now: datetime | None = None, unread: bool = False):
    """A user's inbox: what is visible by ``now`` (a pre-staged reminder shows at its due time);
    ``unread``: only what was not marked read."""
    rows = Notification.objects.filter(user_id=user_id, visible_at__lte=now or timezone.now())
    if unread:
        rows = rows.filter(read_at__isnull=True)
    return rows.order_by("-visible_at", "-id")


def subscription_scheduled_count(*, coupon_id: int) -> int:
    """Scheduled reminders of one coupon (for its change page, never per row of a list)."""
    return ReminderSubscription.objects.filter(
        coupon_id=coupon_id, status=ReminderSubscription.Status.SCHEDULED
    ).count()
