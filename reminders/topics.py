"""The Django side of topics: which topics exist, their handlers, and their live settings.

``coupon.reminder`` is built in; generic topics come from ``settings.TIMEOUT_TOPICS``. Runtime
tunables come from the ``ReminderSettings`` row (for the reminder topic) and from the topic spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from reminders.engine import topics as engine_topics
from reminders.engine.topics import EngineSettings, Topic, TopicSettings

REMINDER_TOPIC = "coupon.reminder"
REMINDER_TOPIC_HIGH = "coupon.reminder.high"
# Reminders of high-priority coupons have their own topic, which workers drain first.
REMINDER_TOPICS = (REMINDER_TOPIC_HIGH, REMINDER_TOPIC)


def reminder_topic_for(priority: str) -> str:
    return REMINDER_TOPIC_HIGH if priority == "high" else REMINDER_TOPIC


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
        engine_topics.check_slots(spec.slots)
        specs[name] = spec
    return specs


def timeout_topic_spec(name: str) -> TimeoutTopicSpec | None:
    return timeout_topic_specs().get(name)


def register_all() -> list[Topic]:
    """Register every topic with the engine (idempotent)."""
    from reminders.services.timeouts import timeout_jobs_dead, timeout_jobs_handle

    topics = []
    for spec in timeout_topic_specs().values():
        topics.append(
            engine_topics.register_topic(
                Topic(
                    name=spec.name,
                    handler=partial(timeout_jobs_handle, spec.name),
                    on_dead=partial(timeout_jobs_dead, spec.name),
                    slots=spec.slots,
                    max_attempts=spec.max_attempts,
                    visibility_ms=spec.visibility_ms,
                    backoff_base_ms=spec.backoff_base_ms,
                    backoff_cap_ms=spec.backoff_cap_ms,
                )
            )
        )
    from reminders.dispatch import reminder_topics

    topics += [engine_topics.register_topic(topic) for topic in reminder_topics()]
    return topics


def engine_settings() -> EngineSettings:
    """One snapshot of the live configuration, read every tick by the workers."""
    from reminders.selectors import reminder_settings_get

    live = reminder_settings_get()
    reminder = TopicSettings(
        slots=live.slots,
        batch_size=live.batch_size,
        visibility_ms=live.visibility_timeout_ms,
        max_attempts=live.max_attempts,
        backoff_base_ms=live.backoff_ms,
        backoff_cap_ms=max(live.backoff_ms, 300_000),
        paused=live.paused,
    )
    per_topic = dict.fromkeys(REMINDER_TOPICS, reminder)
    return EngineSettings(
        tick_ms=live.tick_interval_ms,
        paused=False,
        lease_ms=settings.WORKER_LEASE_MS,
        topics=per_topic,
        version=live.version,
    )
