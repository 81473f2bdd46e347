"""The numbers a topic is tuned by, each defined here once: its default, the range a topic kept
as data may set it within, and what it means (docs/engine.md).

The engine's ``TopicSettings`` takes its defaults from here; a generic timeout topic's spec,
model fields, admin form and API fields are derived from the same knobs, as Django derives a
form field from a model field. The ranges are a generic timeout topic's: the engine itself
refuses only what it cannot represent (``TopicSettings.__post_init__``), so the reminder topics'
live settings keep ranges of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_ATTEMPTS_LIMIT = 999  # the attempt count lives in the last 3 decimal digits of a prepare score


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    default: int
    low: int
    high: int
    help: str
    power_of_two: bool = False


SLOTS = Knob(
    "slots",
    default=8,
    low=1,
    high=1024,
    help="Engine slots (a power of two); a change moves every job, losing none.",
    power_of_two=True,
)
MAX_ATTEMPTS = Knob(
    "max_attempts",
    default=16,
    low=1,
    high=MAX_ATTEMPTS_LIMIT,
    help="Attempts before a job goes dead (kept in the topic's dead queue, with an alert).",
)
BACKOFF_BASE_MS = Knob(
    "backoff_base_ms",
    default=1_000,
    low=1,
    high=3_600_000,
    help="Wait before the first retry (ms); retry n waits min(cap, base x 2^(n-1)).",
)
BACKOFF_CAP_MS = Knob(
    "backoff_cap_ms",
    default=300_000,
    low=1,
    high=86_400_000,
    help="Longest wait between two attempts (ms).",
)
VISIBILITY_MS = Knob(
    "visibility_ms",
    default=30_000,
    low=1_000,
    high=3_600_000,
    help="A job in flight longer than this is taken back and retried.",
)

# What a topic's definition sets in the engine (its batch size is its handler's to choose).
TOPIC_KNOBS = (SLOTS, MAX_ATTEMPTS, BACKOFF_BASE_MS, BACKOFF_CAP_MS, VISIBILITY_MS)


def is_power_of_two(value: int) -> bool:
    """The rule of every slot count: a job's slot is its hash masked by ``slots - 1``."""
    return value >= 1 and value & (value - 1) == 0


def knob_values(source: object, knobs: Sequence[Knob] = TOPIC_KNOBS) -> dict[str, int]:
    """``source``'s value of each knob, by name: a spec's or a row's, handed on whole."""
    return {knob.name: getattr(source, knob.name) for knob in knobs}
