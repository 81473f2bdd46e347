"""Generic timeout topics kept as data (``TimeoutTopic``): the one way to write them, for the
admin and the staff API alike. Workers pick a change up within ``selectors.topics.TOPICS_TTL_S``
(new topics, pauses, slot counts: the engine moves a topic's jobs to a new layout, losing none).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from couponcenter.core.errors import BusinessError
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.selectors.topics import timeout_topics_changed

LIVE = (TimeoutJob.Status.PENDING, TimeoutJob.Status.RUNNING)


class TopicInUse(BusinessError):
    code = "topic_in_use"


def timeout_topic_save(*, topic: TimeoutTopic, **changes: Any) -> TimeoutTopic:
    """Create or change a topic. Raises ``ValidationError`` (nothing saved) for a bad value."""
    if topic.pk is not None and "name" in changes and changes["name"] != topic.name:
        raise ValidationError({"name": "a topic cannot be renamed: its jobs carry the name"})
    for field, value in changes.items():
        setattr(topic, field, value)
    topic.full_clean()
    with transaction.atomic():
        topic.save()
        transaction.on_commit(timeout_topics_changed)
    timeout_topics_changed()
    return topic


def timeout_topic_delete(*, topic: TimeoutTopic) -> None:
    """Delete a topic with no pending or running job (``TopicInUse`` otherwise: pause it)."""
    live = TimeoutJob.objects.filter(topic=topic.name, status__in=LIVE).count()
    if live:
        raise TopicInUse(
            message=f"{live} jobs of {topic.name} are pending or running: pause it instead"
        )
    topic.delete()
    timeout_topics_changed()
