"""The generic timeout topics (article 001) configured in ``settings.TIMEOUT_TOPICS``.

``coupon.reminder`` (and its high-priority twin) are built in (``reminders.members``); generic
topics are usable through ``/api/timeouts/``. Each spec is validated on read.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from couponcenter.core.webhooks import secret_problem
from reminders.engine.topics import check_slots
from reminders.members import REMINDER_TOPICS

TOPIC_TYPES = {"log", "callable", "celery", "http"}


@dataclass(frozen=True)
class TimeoutTopicSpec:
    name: str
    type: str
    slots: int = 8
    max_attempts: int = 16
    visibility_ms: int = 30_000
    backoff_base_ms: int = 1_000  # retry n waits min(cap, base * 2^(n-1))
    backoff_cap_ms: int = 300_000
    path: str = ""
    task: str = ""
    url: str = ""
    secret: str = ""


def timeout_topic_specs() -> dict[str, TimeoutTopicSpec]:
    specs = {}
    for name, raw in settings.TIMEOUT_TOPICS.items():
        try:
            spec = TimeoutTopicSpec(name=name, **raw)
        except TypeError as exc:
            raise ImproperlyConfigured(f"TIMEOUT_TOPICS[{name!r}]: {exc}") from exc
        if spec.type not in TOPIC_TYPES:
            raise ImproperlyConfigured(
                f"TIMEOUT_TOPICS[{name!r}]: type must be one of {TOPIC_TYPES}"
            )
        if name in REMINDER_TOPICS:
            raise ImproperlyConfigured(f"{name} is built in")
        if spec.type == "http":
            problem = secret_problem(spec.secret, what=f"TIMEOUT_TOPICS[{name!r}] secret")
            if problem:
                raise ImproperlyConfigured(problem)
        check_slots(spec.slots)
        specs[name] = spec
    return specs


def timeout_topic_spec(name: str) -> TimeoutTopicSpec | None:
    return timeout_topic_specs().get(name)
