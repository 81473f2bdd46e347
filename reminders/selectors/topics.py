"""The generic timeout topics (article 001): ``TimeoutTopic`` rows, edited while the service
runs, and the read-only ones in ``settings.TIMEOUT_TOPICS`` (which win a name clash).

``coupon.reminder`` (and its high-priority twin) are built in (``reminders.members``); generic
topics are usable through ``/api/timeouts/``. Every spec is validated by ``spec_problems``: the
model's ``clean()`` refuses a bad row, and a bad settings entry stops the start. The rows are
read at most every ``TOPICS_TTL_S`` per process (a worker picks up a change within that time),
and at once after a write through ``services.topics`` in the same process.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from couponcenter.core.caching import TTLCache
from reminders.topic_specs import (
    SETTINGS_KEYS,
    TOPIC_TYPES,
    TimeoutTopicSpec,
    spec_from_topic,
    spec_problems,
)

__all__ = ["TOPIC_TYPES", "TimeoutTopicSpec", "spec_from_topic", "spec_problems"]

logger = logging.getLogger(__name__)
TOPICS_TTL_S = 1.0


def settings_topic_specs() -> dict[str, TimeoutTopicSpec]:
    specs = {}
    for name, raw in settings.TIMEOUT_TOPICS.items():
        unknown = set(raw) - SETTINGS_KEYS
        if unknown:
            raise ImproperlyConfigured(f"TIMEOUT_TOPICS[{name!r}]: unknown keys {sorted(unknown)}")
        spec = TimeoutTopicSpec(name=name, **raw)
        problems = spec_problems(spec, secret_what=f"TIMEOUT_TOPICS[{name!r}] secret")
        if problems:
            field, message = next(iter(problems.items()))
            if field == "secret":
                raise ImproperlyConfigured(message)
            raise ImproperlyConfigured(f"TIMEOUT_TOPICS[{name!r}]: {field}: {message}")
        specs[name] = spec
    return specs


_rows: TTLCache[str, dict[str, TimeoutTopicSpec]] = TTLCache(TOPICS_TTL_S)


def _row_specs() -> dict[str, TimeoutTopicSpec]:
    def load() -> dict[str, TimeoutTopicSpec]:
        from reminders.models import TimeoutTopic

        specs = {}
        for row in TimeoutTopic.objects.all():
            spec = spec_from_topic(row)
            problems = spec_problems(spec)
            if problems:  # written behind the services' back: reported, not used
                logger.error("timeout topic %s is invalid and ignored: %s", row.name, problems)
                continue
            specs[row.name] = spec
        return specs

    return _rows.get("rows", load)


def timeout_topics_changed() -> None:
    """Forget the cached rows (after a write in this process)."""
    _rows.clear()


def timeout_topic_specs() -> dict[str, TimeoutTopicSpec]:
    specs = _row_specs()
    specs = {name: spec for name, spec in specs.items() if name not in settings.TIMEOUT_TOPICS}
    specs.update(settings_topic_specs())
    return dict(sorted(specs.items()))


def timeout_topic_spec(name: str) -> TimeoutTopicSpec | None:
    return timeout_topic_specs().get(name)


def topic_usable_by(spec: TimeoutTopicSpec, user) -> bool:
    """Staff use every topic; a topic with an owner is used by that user or group only. One
    without (the ones in settings unless they name an owner) is staff's alone: a topic is never
    shared by every tenant, whose jobs and attributes would all be open to each other."""
    if user.is_staff:
        return True
    if not spec.owned:
        return False
    if spec.owner_user_id is not None and spec.owner_user_id == user.pk:
        return True
    return spec.owner_group_id is not None and user.groups.filter(pk=spec.owner_group_id).exists()


def timeout_topics_for(user) -> dict[str, TimeoutTopicSpec]:
    return {name: s for name, s in timeout_topic_specs().items() if topic_usable_by(s, user)}
