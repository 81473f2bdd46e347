"""A fixed-window rate throttle kept in Redis: one pipelined round trip (INCR + EXPIRE) per call.

DRF's ``SimpleRateThrottle`` stores every request's timestamp in a cached list and rewrites it on
each call, which is O(rate): at the claim endpoint's 100,000/min per service account that list
would be pickled and unpickled on every request. A counter per (scope, caller, window) is O(1).
The price is the usual one of fixed windows: a caller may send up to twice the rate across a
window boundary.

If Redis cannot be reached the throttle lets the request through (and logs): a throttle outage
must not turn into a claim outage.
"""

from __future__ import annotations

import logging
import time

import redis
from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from couponcenter.redis import get_redis

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
        try:
            pipe = get_redis().pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, self.duration + 1)
            count, _ = pipe.execute()
        except redis.RedisError:
            logger.warning("throttle %s: Redis down, letting the request through", self.scope)
            return True
        return count <= self.num_requests

    def wait(self) -> float:
        return max(self.window_ends - self.now, 0.0)
