"""What the scripts' replies become: the engine's errors and the entries a claim returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..keys import SlotKeys


class EngineError(Exception):
    """Base class of the engine's errors."""


class LeaseLost(EngineError):
    """The slot's lease no longer holds our fencing token: another worker owns the slot now."""

    def __init__(self, keys: SlotKeys):
        super().__init__(f"lease lost on {keys.topic}:{keys.slot}")
        self.topic, self.slot = keys.topic, keys.slot


class Parcel(NamedTuple):
    """A batch claimed as one in-flight entry (``claim_parcel.lua``): settled whole by
    ``settle_parcel``, or reaped whole. ``members`` are the job ids joined by ","."""

    slot: int
    parcel_id: int
    size: int
    members: str
    # Job id -> attempt, for the jobs past their first attempt (the rest are on their first).
    attempts: dict[str, int]

    def job_ids(self) -> list[str]:
        return self.members.split(",")


class Claimed(NamedTuple):
    job_id: str
    due_ms: int
    attempt: int
    # Claimed alone because the reaper brought it back (its handler never answered): a handler
    # that hands entries on should hand this one on alone too.
    suspect: bool = False


@dataclass(frozen=True, slots=True)
class NackResult:
    retried: int
    dead: int
    missing: int


@dataclass(frozen=True, slots=True)
class ReapResult:
    retried: int = 0
    dead: int = 0
    # The jobs that went dead (the owner's on_dead hook puts their database rows in shape).
    dead_ids: tuple[str, ...] = field(default=(), compare=False)
