"""The user's side of the inbox: marking notifications read."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from reminders.models import Notification


def notification_mark_read(
    *, user_id: int, notification_id: int, now: datetime | None = None
) -> Notification:
    """Mark one visible notification of ``user_id`` read (idempotent: the first ``read_at``
    stays). Raises ``Notification.DoesNotExist`` for another user's, an unknown or a not yet
    visible one (a pre-staged reminder is not there for the user yet)."""
    now = now or timezone.now()
    visible = Notification.objects.filter(pk=notification_id, user_id=user_id, visible_at__lte=now)
    visible.filter(read_at__isnull=True).update(read_at=now)
    return visible.get()


def notifications_mark_all_read(*, user_id: int, now: datetime | None = None) -> int:
    """Mark every visible unread notification of ``user_id`` read; returns how many."""
    now = now or timezone.now()
    return Notification.objects.filter(
        user_id=user_id, visible_at__lte=now, read_at__isnull=True
    ).update(read_at=now)
