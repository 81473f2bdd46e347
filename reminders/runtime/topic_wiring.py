"""The worker's composition of topics: every topic with its handler, and the live configuration
the dispatcher asks for every tick.

Generic topics come from their specs (``TimeoutTopic`` rows and ``settings.TIMEOUT_TOPICS``),
read again while the worker runs (``GenericTopics.refresh``): a topic added in the admin starts
firing, a paused one stops claiming, a changed one gets a new executor, a new slot count a new
layout (the engine serves the old one until it drains, so nothing is lost).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial

from django.conf import settings

from reminders.engine import rates, topic_model
from reminders.engine.clock import epoch_ms
from reminders.engine.knobs import knob_values
from reminders.engine.topic_model import EngineSettings, Topic, TopicSettings
from reminders.handlers.coupon_reminders import reminder_topics
from reminders.handlers.timeout_jobs import (
    fire_jobs,
    settle_fired,
    timeout_jobs_dead,
    timeout_jobs_handle,
    timeout_jobs_take,
)
from reminders.members import REMINDER_TOPICS
from reminders.runtime.executors import TopicExecutors
from reminders.runtime.topic_executor import Clock
from reminders.selectors import reminder_settings_get
from reminders.selectors.timeout_topics import timeout_topic_specs
from reminders.timeout_topic_rules import TimeoutTopicSpec

logger = logging.getLogger(__name__)


class GenericTopics:
    """Keeps the engine's registry and this process's executors in step with the specs."""

    def __init__(
        self, *, inline: bool, names: set[str] | None = None, clock: Clock | None = None
    ) -> None:
        self.names = names
        self.executors = TopicExecutors(
            fire=fire_jobs,
            settle=settle_fired,
            inline=inline,
            clock=clock,
            take=None if inline or not settings.TIMEOUT_HOLD_MS else timeout_jobs_take,
        )
        self._specs: dict[str, TimeoutTopicSpec] = {}
        self._topics: dict[str, Topic] = {}

    def refresh(self) -> list[Topic]:
        specs = {
            name: spec
            for name, spec in timeout_topic_specs().items()
            if self.names is None or name in self.names
        }
        if specs != self._specs:
            self._apply(specs)
        return list(self._topics.values())

    def _apply(self, specs: dict[str, TimeoutTopicSpec]) -> None:
        for name in set(self._topics) - set(specs):
            topic_model.unregister_topic(name)
            del self._topics[name]
            logger.info("timeout topic %s removed", name)
        self.executors.sync(specs)
        for name, spec in specs.items():
            if self._specs.get(name) == spec:
                continue
            executor = self.executors.get(name)
            assert executor is not None
            self._topics[name] = topic_model.register_topic(
                Topic(
                    name=name,
                    handler=partial(timeout_jobs_handle, name, executors=self.executors),
                    pass_slot=True,
                    on_dead=partial(timeout_jobs_dead, name),
                    batch_size=executor.batch_size,
                    **knob_values(spec),
                )
            )
            logger.info("timeout topic %s %s", name, "changed" if name in self._specs else "ready")
        self._specs = specs

    def settings(self) -> dict[str, TopicSettings]:
        return {
            name: replace(
                topic.defaults(),
                paused=self._specs[name].paused,
                lookahead_ms=self._lookahead_ms(self._specs[name]),
            )
            for name, topic in self._topics.items()
        }

    def _lookahead_ms(self, spec: TimeoutTopicSpec) -> int:
        """How early the topic's jobs are claimed and held (``TIMEOUT_HOLD_MS``): never more
        than a tenth of the visibility timeout, so holding cannot let an entry expire."""
        executor = self.executors.get(spec.name)
        if executor is None or not executor.holds:
            return 0
        return executor.hold_ms

    def spec(self, topic: str) -> TimeoutTopicSpec | None:
        return self._specs.get(topic)


class ClaimBudget:
    """Caps each claim of a generic topic by its executor's room and its rate limit (a token
    bucket in Redis, shared by every worker); the reminder topics are not capped here."""

    def __init__(self, generic: GenericTopics) -> None:
        self.generic = generic
        # Per topic, what the rate limit alone refused at the last take: a cut for want of
        # executor room holds jobs back too, but is not the limit's doing.
        self._rate_cut: dict[str, int] = {}

    def take(self, topic: Topic, want: int) -> int:
        spec = self.generic.spec(topic.name)
        executor = self.generic.executors.get(topic.name)
        self._rate_cut[topic.name] = 0
        if spec is None or executor is None:
            return want
        want = min(want, executor.room())
        if want <= 0 or not spec.rate_limit_per_s:
            return want
        granted = rates.take(topic.name, spec.rate_limit_per_s, want, now_ms=epoch_ms())
        self._rate_cut[topic.name] = want - granted
        return granted

    def held_back(self, topic: Topic, due_left: int) -> None:
        rates.held_back(topic.name, min(due_left, self.rate_cut(topic)))

    def rate_cut(self, topic: Topic) -> int:
        return self._rate_cut.get(topic.name, 0)

    def give_back(self, topic: Topic, unused: int) -> None:
        spec = self.generic.spec(topic.name)
        if spec is not None and spec.rate_limit_per_s and unused > 0:
            rates.give_back(topic.name, spec.rate_limit_per_s, unused, now_ms=epoch_ms())


def builtin_topics(names: set[str] | None = None) -> list[Topic]:
    """The reminder topics, registered with the engine."""
    topics = [topic_model.register_topic(topic) for topic in reminder_topics()]
    return [t for t in topics if names is None or t.name in names]


def engine_settings(generic: GenericTopics | None = None) -> EngineSettings:
    """One snapshot of the live configuration, read every tick by the workers."""
    live = reminder_settings_get()
    topics: dict[str, TopicSettings] = dict.fromkeys(REMINDER_TOPICS, live.topic_settings())
    if generic is not None:
        topics.update(generic.settings())
    return EngineSettings(
        tick_ms=live.tick_interval_ms,
        paused=False,
        lease_ms=settings.WORKER_LEASE_MS,
        topics=topics,
        version=live.version,
    )
