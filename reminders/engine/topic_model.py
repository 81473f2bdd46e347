"""Topics: a name, a power-of-two slot count, a handler, and their runtime settings.

A handler takes the batch of claimed entries of one slot and says, per entry, what happened:
``OK`` (acked), ``DROP`` (acked and counted: the job can no longer help), ``Retry(error)`` (back
to store after backoff, dead after ``max_attempts``) or ``Dead(error)`` (straight to dead). It
returns a sequence aligned with the entries, a mapping job_id -> result where a missing id
means ``OK``, or one ``Result`` for the whole batch (a handler that hands every entry on says
``HANDED_ON`` once instead of 2,000 times). A handler that raises retries the whole batch with the
exception as the error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum

from .keys import TOPIC_NAME
from .knobs import (
    BACKOFF_BASE_MS,
    BACKOFF_CAP_MS,
    MAX_ATTEMPTS,
    MAX_ATTEMPTS_LIMIT,
    SLOTS,
    VISIBILITY_MS,
    is_power_of_two,
)


class Outcome(Enum):
    OK = "ok"
    DROP = "drop"
    RETRY = "retry"
    DEAD = "dead"
    HANDED_ON = "handed_on"  # left in prepare; settled later by ack_handed / nack_handed


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    error: str = ""


OK = Result(Outcome.OK)
DROP = Result(Outcome.DROP)
HANDED_ON = Result(Outcome.HANDED_ON)


def Retry(error: str) -> Result:
    return Result(Outcome.RETRY, error)


def Dead(error: str) -> Result:
    return Result(Outcome.DEAD, error)


Handler = Callable[..., Sequence[Result] | Mapping[str, Result] | Result]


def check_slots(slots: int) -> int:
    if not isinstance(slots, int) or not is_power_of_two(slots):
        raise ValueError(f"slot count must be a power of two (1, 2, 4, ...), got {slots!r}")
    return slots


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicSettings:
    """What may change at runtime (the Django layer feeds ``ReminderSettings`` in here); the
    defaults are the knobs' (``knobs``)."""

    slots: int = SLOTS.default
    batch_size: int = 1000
    visibility_ms: int = VISIBILITY_MS.default  # a claimed job not acked by then is reaped
    max_attempts: int = MAX_ATTEMPTS.default
    backoff_base_ms: int = BACKOFF_BASE_MS.default  # retry n waits min(cap, base * 2^(n-1))
    backoff_cap_ms: int = BACKOFF_CAP_MS.default
    paused: bool = False
    # Claim what falls due within this many ms ahead (pre-staging): for a handler that makes the
    # result invisible until each entry's due time, so the due moment does not pay for the work.
    lookahead_ms: int = 0

    def __post_init__(self) -> None:
        check_slots(self.slots)
        if self.lookahead_ms < 0:
            raise ValueError("lookahead_ms must not be negative")
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts must be within 1..{MAX_ATTEMPTS_LIMIT}")
        if self.batch_size < 1 or self.visibility_ms < 1:
            raise ValueError("batch_size and visibility_ms must be positive")


@dataclass(frozen=True, slots=True)
class Topic(TopicSettings):
    """A topic: its name and handler, how it is claimed, and its settings (keyword arguments,
    the ``TopicSettings`` fields) until the live configuration says otherwise."""

    name: str
    handler: Handler
    # Called with the ids the reaper sent to dead (their visibility ran out max_attempts times),
    # so the owner can mark its rows and alert: nothing goes dead silently.
    on_dead: Callable[[list[str]], None] | None = None
    pass_slot: bool = False  # handler(entries, slot): a batch always comes from one slot
    priority: int = 0  # higher first: when a tick's budget runs short, lower ones wait
    needs_due: bool = True  # False: claims skip reading due times (faster); Claimed.due_ms is 0
    # Called after every claim round (also one cut short by an error or the time budget): a
    # handler that hands entries on may gather the small batches of one round's slots and
    # publish them together here, so a steady trickle over many slots is one delivery task per
    # round, not one per slot.
    flush: Callable[[], None] | None = None
    # A job the reaper brought back (its handler never answered: the worker died or hung) is
    # claimed and handled alone, so a poison pill does not take its batch-mates down with it
    # again. Off for a handler that only hands entries on (there is no crash to isolate in the
    # dispatcher, and a mass reap after an outage should drain at batch speed).
    isolate_suspects: bool = True
    # Claim each batch as one in-flight parcel (``queue.claim_parcel``): the handler gets a
    # ``Parcel`` instead of a list of entries and must hand it on whole (answer ``HANDED_ON``);
    # whoever it was handed to settles it with ``queue.settle_parcels``. For topics whose
    # handler only hands batches on (coupon reminders): a claim then costs about what a bare pop
    # does, instead of a prepare entry per job. Suspects are not isolated in parcels.
    parcels: bool = False

    def __post_init__(self) -> None:
        if not TOPIC_NAME.match(self.name):
            raise ValueError(f"topic name must match {TOPIC_NAME.pattern}, got {self.name!r}")
        TopicSettings.__post_init__(self)  # a slots dataclass has no zero-argument super()

    def defaults(self) -> TopicSettings:
        return TopicSettings(**{f.name: getattr(self, f.name) for f in fields(TopicSettings)})


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """A snapshot of runtime config; a dispatcher asks its provider for one every tick."""

    tick_ms: int = 1000
    paused: bool = False
    lease_ms: int = 5000
    topics: Mapping[str, TopicSettings] = field(default_factory=dict)
    version: int = 0  # bumped by whoever edits the config; workers report the version they saw

    def for_topic(self, topic: Topic) -> TopicSettings:
        settings = self.topics.get(topic.name) or topic.defaults()
        return replace(settings, paused=True) if self.paused else settings


ConfigProvider = Callable[[], EngineSettings]

_registry: dict[str, Topic] = {}


def register_topic(topic: Topic) -> Topic:
    """Register (or replace, e.g. on reload) a topic by name."""
    _registry[topic.name] = topic
    return topic


def unregister_topic(name: str) -> None:
    _registry.pop(name, None)


def get_topic(name: str) -> Topic:
    try:
        return _registry[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; registered: {sorted(_registry)}") from None


def all_topics() -> list[Topic]:
    return [_registry[name] for name in sorted(_registry)]
