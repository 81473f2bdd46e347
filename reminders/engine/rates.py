"""Per-topic rate limits: a token bucket in Redis (``lua/rate_take.lua``), so the limit holds
across every worker. The dispatcher asks before each claim and claims at most what it was given;
what the claim did not use goes back."""

from __future__ import annotations

from dataclasses import dataclass

from . import connection, keys, scripts
from .connection import Client


@dataclass(frozen=True, slots=True)
class RateState:
    tokens: float  # in the bucket now (refilled up to the moment asked about)
    throttled: int  # due jobs a claim left waiting for want of tokens, since the bucket was made


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


def held_back(topic: str, jobs: int, *, client: Client | None = None) -> None:
    """Count ``jobs`` due jobs a claim left waiting because the bucket ran short (counted per
    claim: a job refused at two claims in a row counts twice)."""
    if jobs > 0:
        connection.client(client).hincrby(keys.rate_bucket(topic), "throttled", jobs)


def state(topic: str, rate_per_s: int, *, now_ms: int, client: Client | None = None) -> RateState:
    """The bucket as of ``now_ms``: the tokens refilled since it was last touched (the stored
    figure is as of the last take), and the jobs held back. An idle bucket that expired is full."""
    raw = connection.client(client).hmget(keys.rate_bucket(topic), ["t", "ms", "throttled"])
    burst = burst_for(rate_per_s)
    if raw[0] is None or raw[1] is None:
        return RateState(float(burst), int(raw[2] or 0))
    refilled = float(raw[0]) + max(0, now_ms - float(raw[1])) * rate_per_s / 1000
    return RateState(min(float(burst), refilled), int(raw[2] or 0))
