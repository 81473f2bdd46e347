"""The generic timeout topics (docs/timeouts.md): ``TimeoutTopic`` rows, edited while the service
runs, and the read-only ones in ``settings.TIMEOUT_TOPICS`` (which win a name clash).

``coupon.reminder`` (and its high-priority twin) are built in (``reminders.members``); generic
topics are usable through ``/api/timeouts/``. Every spec is validated by ``spec_problems``: the
model's ``clean()`` refuses a bad row, and a bad settings entry stops the start.

The rows follow the change marker of the reminders' live settings (``live_settings.MarkedCache``):
every write through ``services.timeout_topics`` moves it in its own transaction, so a request
checks it once and never refuses a topic committed before it began, whichever process wrote it;
a worker picks a change up within ``selectors.SETTINGS_MAX_AGE_S``. The rows are read again only
when the marker moved.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from couponcenter.core.live_settings import MarkedCache
from reminders.models import TimeoutTopic
from reminders.selectors import reminder_settings_marker
from reminders.timeout_topic_rules import (
    SETTINGS_KEYS,
    TimeoutTopicSpec,
    spec_from_topic,
    spec_problems,
)

logger = logging.getLogger(__name__)


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


def _load_rows() -> dict[str, TimeoutTopicSpec]:
    specs = {}
    for row in TimeoutTopic.objects.all():
        spec = spec_from_topic(row)
        problems = spec_problems(spec)
        if problems:  # written behind the services' back: reported, not used
            logger.error("timeout topic %s is invalid and ignored: %s", row.name, problems)
            continue
        specs[row.name] = spec
    return specs


_rows = MarkedCache(marker=reminder_settings_marker, load=_load_rows)


def timeout_topic_specs() -> dict[str, TimeoutTopicSpec]:
    specs = _rows.get()
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
