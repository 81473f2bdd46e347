"""``Idempotency-Key`` on claims: a client that retries a claim gets its first answer again.

A record in Redis per (caller's account, user, key), one string key holding JSON:
- ``{"coupon": id, "token": t}`` while the first request with the key runs ("in flight"), for
  ``_IN_FLIGHT_S``: a concurrent request with the key is answered 409 ``idempotency_key_in_use``
  (retryable: nothing was done for it);
- ``{"coupon": id, "status": n, "body": {...}}`` once it answered 201 or 409, for
  ``CLAIM_IDEMPOTENCY_TTL_S``: a retry gets that answer again (``Idempotent-Replayed: true``),
  one for another coupon a 422 ``idempotency_key_reused``. Other answers (404, 5xx) are not kept:
  the key is free again and a retry runs the claim.

Redis is a convenience here, not the guard: if it is unreachable the claim runs without a record,
and the key stored on the user coupon (``UserCoupon.idempotency_key``, unique per coupon and user)
still turns a retry of a claim that succeeded into its first 201 (``claims.py``).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable

import redis
from django.conf import settings
from rest_framework import status
from rest_framework.response import Response

from couponcenter.core.redis import get_redis
from couponcenter.coupons.models import IDEMPOTENCY_KEY_MAX_LENGTH

logger = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
META_NAME = "HTTP_IDEMPOTENCY_KEY"
REPLAYED_HEADER = "Idempotent-Replayed"
IN_USE = "idempotency_key_in_use"
REUSED = "idempotency_key_reused"
KEY_ERROR = (
    f"{HEADER} must be 1 to {IDEMPOTENCY_KEY_MAX_LENGTH} printable ASCII characters "
    "(space to ~, no control characters)."
)
# Answers a retry gets again; anything else leaves the key free for the retry to run the claim.
_KEPT = frozenset({status.HTTP_201_CREATED, status.HTTP_409_CONFLICT})
# Longer than a request can take (gunicorn's timeout is 30 s): past it the first request is dead,
# and a retry may run the claim (the key on the user coupon keeps that from claiming twice).
_IN_FLIGHT_S = 60
_VALID = re.compile(rf"[\x20-\x7e]{{1,{IDEMPOTENCY_KEY_MAX_LENGTH}}}")

# The record as it is, or absent and now reserved by this request (in one round trip).
_RESERVE = """
local record = redis.call('GET', KEYS[1])
if record then return record end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return false
"""
# Free the key, if it is still this request's reservation.
_RELEASE = """
local record = redis.call('GET', KEYS[1])
if record and cjson.decode(record)['token'] == ARGV[1] then redis.call('DEL', KEYS[1]) end
"""


def key_is_valid(key: str) -> bool:
    """A header value as the WSGI server hands it (latin-1 decoded): non-ASCII bytes fail too."""
    return _VALID.fullmatch(key) is not None


def column_value(*, caller_id: int, key: str) -> str:
    """What the user coupon stores: the key scoped by the caller, as the Redis record is."""
    return f"{caller_id}:{key}"


def answer_once(
    *, caller_id: int, user_id: int, coupon_id: int, key: str, claim: Callable[[], Response]
) -> Response:
    """``claim()``'s answer, or the answer kept for this key; ``claim`` answers every business
    outcome as a Response and raises only what is a 5xx."""
    record_key = f"{settings.REDIS_KEY_PREFIX}:idem:{caller_id}:{user_id}:{key}"
    token = secrets.token_hex(8)
    try:
        earlier = _reserve(record_key, coupon_id=coupon_id, token=token)
    except redis.RedisError:
        logger.warning("idempotency: Redis unreachable, claiming without a record")
        return claim()
    if earlier is not None:
        return _earlier_answer(earlier, coupon_id=coupon_id)
    try:
        response = claim()
    except BaseException:
        _forget(record_key, token=token)
        raise
    if response.status_code in _KEPT:
        _keep(record_key, coupon_id=coupon_id, response=response)
    else:
        _forget(record_key, token=token)
    return response


def replayed(response: Response) -> Response:
    response[REPLAYED_HEADER] = "true"
    return response


def _reserve(record_key: str, *, coupon_id: int, token: str) -> dict | None:
    reservation = json.dumps({"coupon": coupon_id, "token": token})
    client = get_redis()
    record = client.register_script(_RESERVE)(
        keys=[record_key], args=[reservation, _IN_FLIGHT_S], client=client
    )
    return None if record is None else json.loads(record)


def _earlier_answer(record: dict, *, coupon_id: int) -> Response:
    if record["coupon"] != coupon_id:
        body = {
            "code": REUSED,
            "detail": f"This {HEADER} was sent with another coupon ({record['coupon']}); "
            "use a new key for a new claim.",
        }
        return Response(body, status=status.HTTP_422_UNPROCESSABLE_ENTITY)
    if "status" not in record:
        body = {
            "code": IN_USE,
            "detail": f"A claim with this {HEADER} is still running; retry in a moment.",
        }
        return Response(body, status=status.HTTP_409_CONFLICT, headers={"Retry-After": "1"})
    return replayed(Response(record["body"], status=record["status"]))


def _keep(record_key: str, *, coupon_id: int, response: Response) -> None:
    record = {"coupon": coupon_id, "status": response.status_code, "body": response.data}
    try:
        get_redis().set(record_key, json.dumps(record), ex=settings.CLAIM_IDEMPOTENCY_TTL_S)
    except redis.RedisError:
        logger.warning("idempotency: Redis unreachable, the answer is not kept")


def _forget(record_key: str, *, token: str) -> None:
    try:
        client = get_redis()
        client.register_script(_RELEASE)(keys=[record_key], args=[token], client=client)
    except redis.RedisError:
        # The reservation expires by itself after _IN_FLIGHT_S.
        logger.warning("idempotency: Redis unreachable, the key stays reserved a while")
