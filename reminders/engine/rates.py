"""Per-topic rate limits: a token bucket in Redis (``lua/rate_take.lua``), so the limit holds
across every worker. The dispatcher asks before each claim and claims at most what it was given;
what the claim did not use goes back."""

from __future__ import annotations

from dataclasses import dataclass

from . import connection, keys, scripts
from .connection import Client


@dataclass(frozen=True, slots=True)
class RateState:
    tokens: float
    throttled: int  # entries a claim wanted and was refused, since the bucket was created


def burst_for(rate_per_s: int) -> int:
    """The bucket size: a tenth of a second's worth (at least 1), so a limit holds over any
    second while one claim may still take a useful batch."""
    return max(1, rate_per_s // 10)


def take(
    topic: str, rate_per_s: int, want: int, *, now_ms: int, client: Client | None = None
) -> int:
    """Up to ``want`` tokens of ``topic``'s bucket (refilled at ``rate_per_s``)."""
    return int(
        scripts.RATE_TAKE(
            connection.client(client),
            [keys.rate_bucket(topic)],
            [rate_per_s, burst_for(rate_per_s), now_ms, want, 0],
        )
    )


def give_back(
    topic: str, rate_per_s: int, unused: int, *, now_ms: int, client: Client | None = None
) -> None:
    scripts.RATE_TAKE(
        connection.client(client),
        [keys.rate_bucket(topic)],
        [rate_per_s, burst_for(rate_per_s), now_ms, 0, unused],
    )


def state(topic: str, *, client: Client | None = None) -> RateState | None:
    raw = connection.client(client).hmget(keys.rate_bucket(topic), ["t", "throttled"])
    if raw[0] is None:
        return None
    return RateState(float(raw[0]), int(raw[1] or 0))
