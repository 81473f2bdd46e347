"""Generic timeout topics kept as data (``TimeoutTopic``): the one way to write them, for the
admin and the staff API alike. Each write moves the reminders' change marker in its own
transaction (``services.config.reminder_settings_touch``): the next request sees it, whichever
process serves it, and the workers pick it up within ``selectors.SETTINGS_MAX_AGE_S`` (new topics,
pauses, slot counts: the engine moves a topic's jobs to a new layout, losing none).

A job names its topic, not its topic's owner, so a topic's jobs live and die with it: a topic is
deleted only once none of its jobs is pending or running, and its other jobs (fired, cancelled,
dead: their attributes and history) go with it, from the database and from Redis. A new topic
never takes a name that still has jobs: finished ones left behind (a delete cut short) are
purged first, live ones refuse the name until staff cancel them. Otherwise a topic made later
under the name, for another owner, would show that owner the old jobs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from couponcenter.core.db.row_movement import retry_if_moved
from couponcenter.core.errors import BusinessError
from reminders.engine import queue
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.selectors import reminder_settings_recheck
from reminders.services.config import reminder_settings_touch

LIVE = (TimeoutJob.Status.PENDING, TimeoutJob.Status.RUNNING)
# Jobs of a deleted topic removed per transaction (and per pipelined Redis cancel).
PURGE_CHUNK = 2000


class TopicInUse(BusinessError):
    code = "topic_in_use"


def timeout_topic_save(*, topic: TimeoutTopic, **changes: Any) -> TimeoutTopic:
    """Create or change a topic. Raises ``ValidationError`` (nothing saved) for a bad value."""
    if topic.pk is not None and "name" in changes and changes["name"] != topic.name:
        raise ValidationError({"name": "a topic cannot be renamed: its jobs carry the name"})
    for field, value in changes.items():
        setattr(topic, field, value)
    _keep_rotated_secret(topic)
    topic.full_clean()
    if topic.pk is None:
        _clear_name(topic.name)
    with transaction.atomic():
        topic.save()
        reminder_settings_touch()
    reminder_settings_recheck()  # this process reads it at once, in a request or not
    return topic


def _keep_rotated_secret(topic: TimeoutTopic) -> None:
    """A changed secret: the stored one keeps signing beside it for the overlap, so receivers
    still holding it verify every call until they have the new one (docs/timeouts.md)."""
    stored = TimeoutTopic.objects.filter(pk=topic.pk).values_list("secret", flat=True).first()
    if not stored or stored == topic.secret:
        return
    topic.previous_secret = stored
    topic.previous_secret_until = timezone.now() + timedelta(
        seconds=settings.WEBHOOK_SECRET_OVERLAP_S
    )


def timeout_topic_delete(*, topic: TimeoutTopic) -> int:
    """Delete a topic with no pending or running job (``TopicInUse`` otherwise: pause it, or
    cancel them), and every other job it has had; returns how many jobs went with it."""
    with transaction.atomic():
        TimeoutTopic.objects.select_for_update().filter(pk=topic.pk).first()  # one delete at once
        live = TimeoutJob.objects.filter(topic=topic.name, status__in=LIVE).count()
        if live:
            raise TopicInUse(
                message=f"{_jobs(live)} of {topic.name} still pending or running: pause it "
                "instead, or cancel them first"
            )
        topic.delete()
        reminder_settings_touch()
    reminder_settings_recheck()
    return _purge_finished(topic.name)


def _clear_name(name: str) -> None:
    """Make ``name`` free for a new topic: ``ValidationError`` while jobs of it are live."""
    live = TimeoutJob.objects.filter(topic=name, status__in=LIVE).count()
    if live:
        raise ValidationError(
            {
                "name": f"{_jobs(live)} of an earlier topic named {name} still pending or "
                "running: cancel them before the name is used again"
            }
        )
    _purge_finished(name)


def _purge_finished(name: str) -> int:
    """Delete the jobs of ``name`` that are not live, a chunk per transaction, and their Redis
    entries (a dead job's, or one a settle left behind) once each chunk commits."""
    purged, last_pk = 0, 0
    while True:
        with transaction.atomic():
            chunk = list(
                TimeoutJob.objects.filter(topic=name, pk__gt=last_pk)
                .exclude(status__in=LIVE)
                .order_by("pk")
                .values_list("pk", "slot")[:PURGE_CHUNK]
            )
            if not chunk:
                return purged
            finished = TimeoutJob.objects.filter(pk__in=[pk for pk, _ in chunk]).exclude(
                status__in=LIVE
            )
            retry_if_moved(finished.delete)
            entries = [(str(pk), slot) for pk, slot in chunk]
            transaction.on_commit(lambda entries=entries: queue.cancel_many(name, entries))
        purged += len(chunk)
        last_pk = chunk[-1][0]
        if len(chunk) < PURGE_CHUNK:
            return purged


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"
