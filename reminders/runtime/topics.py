"""The worker's composition of topics: every topic with its handler, and the live configuration
the dispatcher asks for every tick."""

from __future__ import annotations

from functools import partial

from django.conf import settings

from reminders.engine import topics as engine_topics
from reminders.engine.topics import EngineSettings, Topic
from reminders.handlers.coupon_reminders import reminder_topics
from reminders.handlers.timeout_jobs import timeout_jobs_dead, timeout_jobs_handle
from reminders.members import REMINDER_TOPICS
from reminders.selectors import reminder_settings_get
from reminders.selectors.topics import timeout_topic_specs


def register_all() -> list[Topic]:
    """Register every topic with the engine (idempotent)."""
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
    topics += [engine_topics.register_topic(topic) for topic in reminder_topics()]
    return topics


def engine_settings() -> EngineSettings:
    """One snapshot of the live configuration, read every tick by the workers."""
    live = reminder_settings_get()
    return EngineSettings(
        tick_ms=live.tick_interval_ms,
        paused=False,
        lease_ms=settings.WORKER_LEASE_MS,
        topics=dict.fromkeys(REMINDER_TOPICS, live.topic_settings()),
        version=live.version,
    )
