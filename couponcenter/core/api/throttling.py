"""A fixed-window rate throttle kept in Redis: a counter per (scope, caller, window).

DRF's ``SimpleRateThrottle`` stores every request's timestamp in a cached list and rewrites it on
each call, which is O(rate): at the claim endpoint's 100,000/min per service account that list
would be pickled and unpickled on every request. A counter per (scope, caller, window) is O(1).
The price is the usual one of fixed windows: a caller may send up to twice the rate across a
window boundary.

``FixedWindowScopedThrottle`` makes one pipelined round trip (INCRBY + EXPIRE) per request.
``BatchedFixedWindowScopedThrottle`` (the claim endpoint, ``THROTTLE_CLAIM_SYNC_MS``) counts in
the process and adds its count to Redis at most every ``sync_ms``: a request is let through
without a round trip while the window's count as Redis last answered, plus what this process let
through since, is under the limit. So a process is exact on its own, and all processes together
may let through up to the requests the *other* processes admitted since this one's last sync
(within one ``sync_ms``) above the limit; at the limit every request asks Redis, so a caller
held back stays held back. Batching spares each claim a Redis round trip, a sizeable share of
its CPU.

If Redis cannot be reached the throttle lets the request through (and logs): a throttle outage
must not turn into a claim outage.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from couponcenter.core.redis import get_redis

logger = logging.getLogger(__name__)


class FixedWindowScopedThrottle(ScopedRateThrottle):
    def allow_request(self, request: Request, view: APIView) -> bool:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return True
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        if self.rate is None:
            return True
        ident = self.get_cache_key(request, view)
        if ident is None:
            return True
        self.now = time.time()
        window = int(self.now // self.duration)
        self.window_ends = (window + 1) * self.duration
        key = f"{settings.REDIS_KEY_PREFIX}:throttle:{ident}:{window}"
        return self.count_allows(key)

    def count_allows(self, key: str) -> bool:
        """Count this request under ``key``; whether the window's count is within the rate."""
        count = self.add(key, 1)
        return count is None or count <= self.num_requests

    def add(self, key: str, n: int) -> int | None:
        """Add ``n`` to the window's counter in Redis; its new value (None: Redis is down)."""
        try:
            pipe = get_redis().pipeline(transaction=False)
            pipe.incrby(key, n)
            pipe.expire(key, self.duration + 1)
            count, _ = pipe.execute()
        except redis.RedisError:
            logger.warning("throttle %s: Redis down, letting the request through", self.scope)
            return None
        return count

    def wait(self) -> float:
        return max(self.window_ends - self.now, 0.0)


class _Window:
    __slots__ = ("known", "pending", "synced_at")

    def __init__(self) -> None:
        self.known = 0  # the window's count in Redis at the last sync
        self.pending = 0  # let through here since, not yet added to Redis
        self.synced_at = -1e9


_lock = threading.Lock()
_windows: dict[str, _Window] = {}
_MAX_WINDOWS = 10_000


def throttle_windows_clear() -> None:
    """Forget this process's counts not yet added to Redis (tests)."""
    with _lock:
        _windows.clear()


class BatchedFixedWindowScopedThrottle(FixedWindowScopedThrottle):
    """The same windows and keys, but at most one Redis round trip per ``sync_ms`` and process
    (see the module's docstring for the approximation)."""

    @property
    def sync_ms(self) -> float:
        return settings.THROTTLE_CLAIM_SYNC_MS

    def count_allows(self, key: str) -> bool:
        sync_s = self.sync_ms / 1000
        if sync_s <= 0:
            return super().count_allows(key)
        now = time.monotonic()
        with _lock:
            state = _windows.get(key)
            if state is None:
                if len(_windows) >= _MAX_WINDOWS:
                    _windows.clear()  # old windows; their pending counts are at most sync_ms old
                state = _windows[key] = _Window()
            if now - state.synced_at < sync_s and state.known + state.pending < self.num_requests:
                state.pending += 1
                return True
            # Due for a sync, or at the limit as far as this process knows: ask Redis.
            n, state.pending, state.synced_at = state.pending + 1, 0, now
        count = self.add(key, n)
        if count is None:
            return True
        with _lock:
            state.known = max(state.known, count)
        return count <= self.num_requests
