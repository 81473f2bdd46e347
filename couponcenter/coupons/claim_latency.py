"""The claims' reading for the urgency signal (``couponcenter.core.urgency``, docs/operations.md):
the p99 time to answer a claim over the last second, per web process.

Each process times its claim answers (``observe``, a 201 or a refusal alike) and, on the first
answer of a new second, writes the closed second's p99 and count into one Redis hash, a field per
process (one HSET a second per process, nothing per claim). ``claims_readings`` takes the worst
p99 among the processes that wrote within ``FRESH_MS``: a process that stopped answering claims
says nothing, and its field is removed. A claim stuck in PostgreSQL counts when it is answered.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time

import redis
from django.conf import settings

from couponcenter.core.redis import get_redis
from couponcenter.core.urgency import Reading

logger = logging.getLogger(__name__)

CLAIMS = "claims"
# A process's figure older than this is not counted (it answered no claim since).
FRESH_MS = 3000
_KEY_TTL_S = 60


def latency_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}:urgency:claims"


def _p99(samples: list[float]) -> int:
    ordered = sorted(samples)
    return round(ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)])


class ClaimLatency:
    """This process's claim answer times of the current second (ms)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._second = 0
        self._samples: list[float] = []
        self.field = f"{socket.gethostname()}:{os.getpid()}"

    def observe(self, ms: float, *, now_ms: int | None = None) -> None:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        second = now_ms // 1000
        with self._lock:
            if second == self._second:
                self._samples.append(ms)
                return
            closed, self._samples, self._second = self._samples, [ms], second
        if closed:
            self._write(now_ms, _p99(closed), len(closed))

    def _write(self, now_ms: int, p99_ms: int, count: int) -> None:
        try:
            pipe = get_redis().pipeline(transaction=False)
            pipe.hset(latency_key(), self.field, f"{now_ms} {p99_ms} {count}")
            pipe.expire(latency_key(), _KEY_TTL_S)
            pipe.execute()
        except redis.RedisError:
            logger.warning("claims: could not record the answer times", exc_info=True)


# The web process's own.
claim_latency = ClaimLatency()


def claims_readings(now_ms: int) -> list[Reading]:
    """The worst p99 among the processes that answered claims within ``FRESH_MS``."""
    client = get_redis()
    worst, stale = 0, []
    for field, value in client.hgetall(latency_key()).items():
        at_ms, p99_ms, _ = (int(part) for part in value.split())
        if now_ms - at_ms > FRESH_MS:
            stale.append(field)
        else:
            worst = max(worst, p99_ms)
    if stale:
        client.hdel(latency_key(), *stale)
    return [Reading(CLAIMS, worst, settings.URGENT_CLAIMS_TARGET_MS)]
