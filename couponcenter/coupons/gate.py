"""The claim gate: a coupon's claim rules in Redis, answered by one script per claim.

At the opening of a popular coupon most claims can only be refused (not open yet, sold out, the
user's limit reached). The gate answers those without PostgreSQL, and reserves a unit ("a hold")
for each claim it lets through; PostgreSQL stays the truth and the guard (the stock shards, their
check constraint, the unique claim number), the gate only keeps refusals away from it
(docs/claims.md, The gate).

Per coupon, three keys under one hash tag ``{<id>}`` (one cluster slot, so one script touches
them all) and under ``settings.REDIS_KEY_PREFIX``:

- ``<prefix>:gate:{<id>}`` HASH ``opens_ms``, ``closes_ms`` (the earlier of ``claim_closes_at``
  and ``expires_at``, 0 for none), ``cancelled``, ``limit``, ``stock``, ``taken`` (units claimed in
  PostgreSQL plus units held), ``built_ms`` and ``expires_ms`` (when the keys go: ``_KEEP_S``
  after the claims close);
- ``...:users`` HASH user id -> that user's claims (committed and held);
- ``...:held`` ZSET hold -> server ms when reserved: the claims in flight.

A hold is given back by ``gate_release`` (never committed), forgotten by ``gate_settle``
(committed: PostgreSQL counts it now), and dropped by a rebuild (``gate_build``, which is the
reconcile). A rebuild reads the coupon, the shards' claims and every user's claim count in one
PostgreSQL snapshot, then drops the holds reserved before that snapshot (their claims are either
in it or will be missed, and a missed one only lets the gate admit a little more: PostgreSQL
refuses the excess, and ``gate_sold_out`` / ``gate_user_full`` teach the gate at once). So once
the claims in flight are over and a rebuild has run, ``taken`` equals the claims in PostgreSQL
and no unit is lost. ``gates_maintain`` runs that rebuild on its own where it is needed (stale
holds, drift, a coupon changed or a gate lost), and builds the gates of coupons about to open.

Each web process remembers a refusal that holds for every user of a coupon (sold out, not open
yet, closed, cancelled) for ``GATE_LOCAL_MS`` and answers it again without Redis: at the opening
of a popular coupon almost every claim is one of these, and then costs no round trip. A
remembered refusal can only refuse a little longer than the gate would; a unit given back in the
same process, or a rebuild there, forgets it at once.

Redis errors: ``gate_claim`` answers None (the claim goes to PostgreSQL) and leaves Redis alone
for ``_RETRY_S``, so an outage costs each claim nothing; settle and release log and move on (the
hold goes stale, and the reconcile fixes the counts).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from couponcenter.core.redis import Client, get_redis, is_cluster

from .models import Coupon, CouponStockShard, UserCoupon

logger = logging.getLogger(__name__)

LUA_DIR = Path(__file__).parent / "lua"
# A gate outlives its coupon's claims by this long (it answers `closed` without PostgreSQL); a
# coupon with no end keeps its gate this long past the build, renewed by gates_maintain.
_KEEP_S = 3600
# After a Redis error the gate is left alone for this long: claims go straight to PostgreSQL.
_RETRY_S = 1.0
# gate_build_soon's lock: one build per coupon at a time across processes; it lapses by itself
# if its process dies mid-build.
_BUILD_LOCK_MS = 30_000
# A background build's thread is named this, then the coupon's id.
BUILD_THREAD_PREFIX = "gate-build-"
# The users' claim counts go to Redis this many fields per HSET, this many HSETs per round trip.
_HSET_FIELDS = 1000
_PIPELINE_HSETS = 10
_TEMP_TTL_MS = 600_000  # a build that died half-way leaves nothing behind for long


@dataclass(frozen=True, slots=True)
class GatePass:
    """A unit reserved: ``seq`` is the user's claim number (``UserCoupon.seq``), ``hold`` the
    reservation to settle (committed) or release (not)."""

    seq: int
    hold: str


@dataclass(frozen=True, slots=True)
class GateRefusal:
    """``cancelled``, ``not_open`` (with ``opens_ms``), ``closed`` (with ``closes_ms``),
    ``limit_reached`` or ``sold_out``: the claim's answer, without PostgreSQL."""

    code: str
    opens_ms: int | None = None
    closes_ms: int | None = None


class _Lua:
    """A script of ``lua/``, run by EVALSHA (redis-py loads it again after a NOSCRIPT)."""

    def __init__(self, text: str):
        self.text = text
        self._script: Any = None

    @classmethod
    def file(cls, name: str) -> _Lua:
        return cls((LUA_DIR / f"{name}.lua").read_text())

    def __call__(self, client: Client, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self._script is None:
            self._script = client.register_script(self.text)
        return self._script(keys=keys, args=args, client=client)


_CLAIM = _Lua.file("gate_claim")
_RELEASE = _Lua.file("gate_release")
_CORRECT = _Lua.file("gate_correct")
_SWAP = _Lua.file("gate_swap")
# The server's clock, from the node holding the coupon's keys (on a cluster, TIME alone would go
# to any node): holds are stamped by it, and a build tells old holds from new by it.
_SERVER_MS = _Lua(
    "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)  -- KEYS[1]: slot"
)
_UNLOCK = _Lua(
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)

_down_until: dict[str, float] = {}  # REDIS_URL -> monotonic time the gate may ask Redis again

# Refusals that hold for every user of a coupon, which this process answers again by itself for
# GATE_LOCAL_MS (a `not_open` only until the opening it names).
_COUPON_WIDE = frozenset({"sold_out", "not_open", "closed", "cancelled"})
# the gate's key (the coupon under this Redis and prefix) -> (monotonic until, refusal)
_remembered: dict[str, tuple[float, GateRefusal]] = {}
_REMEMBER_MAX = 10_000


def _keys(coupon_id: int) -> tuple[str, str, str]:
    gate = f"{settings.REDIS_KEY_PREFIX}:gate:{{{coupon_id}}}"
    return gate, f"{gate}:users", f"{gate}:held"


def _redis() -> Client | None:
    """The client, or None while Redis is taken as down (``_RETRY_S`` after an error)."""
    if time.monotonic() < _down_until.get(settings.REDIS_URL, 0.0):
        return None
    return get_redis()


def _redis_failed(what: str, exc: Exception) -> None:
    _down_until[settings.REDIS_URL] = time.monotonic() + _RETRY_S
    logger.warning("claim gate: %s failed (%s); claims go to PostgreSQL for now", what, exc)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- a claim --------------------------------------------------------------------------------


def gate_claim(*, coupon_id: int, user_id: int, now_ms: int) -> GatePass | GateRefusal | None:
    """The gate's answer to a claim at ``now_ms``; None when it has none (no gate for the coupon,
    Redis unreachable, the gate switched off): then PostgreSQL decides, and the caller asks for a
    rebuild with ``gate_build_soon``."""
    return gate_claim_many(coupon_id=coupon_id, claims=[(user_id, now_ms)])[0]


def gate_claim_many(
    *, coupon_id: int, claims: Sequence[tuple[int, int]]
) -> list[GatePass | GateRefusal | None]:
    """``gate_claim`` for several claims ``(user_id, now_ms)`` of one coupon, in order, in one
    round trip: what a group of claims committed together asks (``claim_groups``)."""
    answers: list[GatePass | GateRefusal | None] = [None] * len(claims)
    asked = []
    for i, (_, now_ms) in enumerate(claims):
        answers[i] = gate_remembered(coupon_id=coupon_id, now_ms=now_ms)
        if answers[i] is None:
            asked.append(i)
    client = _redis() if asked and settings.CLAIM_GATE else None
    if client is None:
        return answers
    holds = {i: f"{claims[i][0]}:{os.urandom(6).hex()}" for i in asked}
    args = [value for i in asked for value in (claims[i][0], claims[i][1], holds[i])]
    try:
        reply = _CLAIM(client, _keys(coupon_id), args)
    except redis.RedisError as exc:
        _redis_failed("a claim", exc)
        return answers
    if _text(reply[0]) == "missing":
        return answers
    for n, i in enumerate(asked):
        code, value = _text(reply[2 * n]), int(reply[2 * n + 1])
        if code == "pass":
            answers[i] = GatePass(seq=value, hold=holds[i])
            continue
        refusal = GateRefusal(
            code=code,
            opens_ms=value if code == "not_open" else None,
            closes_ms=value if code == "closed" else None,
        )
        answers[i] = refusal
        if code in _COUPON_WIDE and settings.GATE_LOCAL_MS:
            _remember(coupon_id, refusal)
    return answers


def gate_remembered(*, coupon_id: int, now_ms: int) -> GateRefusal | None:
    """The coupon-wide refusal this process had from the gate lately, if it is the answer at
    ``now_ms`` too (``GATE_LOCAL_MS``); asks nothing of Redis."""
    remembered = _remembered.get(_keys(coupon_id)[0])
    if remembered is None or time.monotonic() >= remembered[0]:
        return None
    return remembered[1] if _still_holds(remembered[1], now_ms) else None


def _remember(coupon_id: int, refusal: GateRefusal) -> None:
    if len(_remembered) >= _REMEMBER_MAX:
        _remembered.clear()
    _remembered[_keys(coupon_id)[0]] = (time.monotonic() + settings.GATE_LOCAL_MS / 1000, refusal)


def _still_holds(refusal: GateRefusal, now_ms: int) -> bool:
    """Whether a remembered refusal is the answer at ``now_ms`` too (the window's moments are
    each claim's own)."""
    if refusal.opens_ms is not None:
        return now_ms < refusal.opens_ms
    if refusal.closes_ms is not None:
        return now_ms >= refusal.closes_ms
    return True


def gate_settle(*, coupon_id: int, holds: Sequence[str]) -> None:
    """The holds' claims committed: PostgreSQL counts them now, so the holds go (``taken`` and
    the users' counts stay)."""
    client = _redis() if holds else None
    if client is None:
        return  # the holds go stale; the reconcile drops them
    try:
        client.zrem(_keys(coupon_id)[2], *holds)
    except redis.RedisError as exc:
        _redis_failed("a settle", exc)


def gate_release(*, coupon_id: int, user_id: int, hold: str) -> None:
    """The hold's claim never committed: its unit and the user's count come back, once (a hold
    already gone, released or dropped by a rebuild, gives nothing back)."""
    _remembered.pop(_keys(coupon_id)[0], None)
    client = _redis()
    if client is None:
        return
    try:
        _RELEASE(client, _keys(coupon_id), (user_id, hold))
    except redis.RedisError as exc:
        _redis_failed("a release", exc)


def gate_sold_out(*, coupon_id: int) -> None:
    """PostgreSQL answered ``sold_out`` to a claim the gate let through: ``taken`` rises to the
    stock, so the next claims are refused here."""
    _correct(coupon_id, "sold_out", "")


def gate_user_full(*, coupon_id: int, user_id: int) -> None:
    """PostgreSQL answered ``limit_reached``: the user's count rises to the limit."""
    _correct(coupon_id, "user_full", user_id)


def _correct(coupon_id: int, what: str, user_id: int | str) -> None:
    client = _redis()
    if client is None:
        return
    try:
        _CORRECT(client, _keys(coupon_id)[:2], (what, user_id))
    except redis.RedisError as exc:
        _redis_failed(f"a correction ({what})", exc)


# --- building a gate from PostgreSQL ----------------------------------------------------------

# What a gate is built from: the coupon's fields it copies (a change of any other field leaves
# the gate as it is), and those the upkeep reads besides.
GATE_COUPON_FIELDS = (
    "status",
    "claim_opens_at",
    "claim_closes_at",
    "expires_at",
    "total_stock",
    "per_user_limit",
)
_ROW_FIELDS = (*GATE_COUPON_FIELDS, "claimed_count")
_GATE_FIELDS = ("opens_ms", "closes_ms", "cancelled", "limit", "stock")


def ms_of(moment: datetime) -> int:
    """A moment as the gate keeps it: epoch milliseconds."""
    return int(moment.timestamp() * 1000)


def moment_of(ms: int) -> datetime:
    """The moment of a gate's epoch milliseconds (UTC)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _closes_ms(row: dict) -> int:
    ends = [t for t in (row["claim_closes_at"], row["expires_at"]) if t is not None]
    return ms_of(min(ends)) if ends else 0


def _expires_ms(row: dict, now_ms: int) -> int:
    """When the gate's keys go: ``_KEEP_S`` after the claims close, or after now for a cancelled
    coupon; a coupon with no end keeps its gate ``_KEEP_S`` past its opening or now."""
    closes = _closes_ms(row)
    if row["status"] == Coupon.Status.CANCELLED:
        end = now_ms
    elif closes:
        end = max(closes, now_ms)
    else:
        end = max(ms_of(row["claim_opens_at"]), now_ms)
    return end + _KEEP_S * 1000


def _gate_fields(row: dict) -> tuple[int, ...]:
    """The values of ``_GATE_FIELDS`` for a coupon row."""
    return (
        ms_of(row["claim_opens_at"]),
        _closes_ms(row),
        int(row["status"] == Coupon.Status.CANCELLED),
        row["per_user_limit"],
        row["total_stock"],
    )


@contextmanager
def _snapshot():
    """One PostgreSQL snapshot for the reads of a build (REPEATABLE READ, read only), unless the
    caller's transaction is open already (then its own)."""
    fresh = not connection.in_atomic_block and connection.vendor == "postgresql"
    with transaction.atomic():
        if fresh:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def gate_build(*, coupon_id: int) -> bool:
    """Build (or rebuild: this is the reconcile) the coupon's gate from PostgreSQL; False when
    the gate is off or Redis is taken as down, and the gate is deleted if the coupon is gone.

    The users' claim counts are streamed into a temporary hash in chunks, and one script swaps
    them in, with the holds reserved after the snapshot added on top of it."""
    _remembered.pop(_keys(coupon_id)[0], None)
    client = _redis() if settings.CLAIM_GATE else None
    if client is None:
        return False
    gate, users, held = _keys(coupon_id)
    temp = f"{gate}:build:{os.urandom(6).hex()}"
    with _snapshot():
        row = Coupon.objects.filter(pk=coupon_id).values(*_ROW_FIELDS).first()
        if row is None:
            client.delete(gate, users, held)
            return False
        # Read after the snapshot is taken (its first statement above): a hold stamped later is
        # certainly a claim the snapshot does not hold.
        mark_ms = int(_SERVER_MS(client, (gate,), ()))
        claimed = _claimed_in_shards([coupon_id]).get(coupon_id)
        if claimed is None:  # not sharded yet: stock.stock_shards_ensure counts it so
            claimed = min(row["claimed_count"], row["total_stock"])
        counts = (
            UserCoupon.objects.filter(coupon_id=coupon_id)
            .order_by()
            .values_list("user_id")
            .annotate(n=Count("id"))
            .iterator(chunk_size=_HSET_FIELDS * _PIPELINE_HSETS)
        )
        _fill(client, temp, counts)
    args = [mark_ms, _expires_ms(row, mark_ms), claimed]
    for name, value in zip(_GATE_FIELDS, _gate_fields(row), strict=True):
        args += [name, value]
    _SWAP(client, (gate, users, held, temp), args)
    return True


def _claimed_in_shards(coupon_ids: Iterable[int]) -> dict[int, int]:
    rows = (
        CouponStockShard.objects.filter(coupon_id__in=list(coupon_ids))
        .order_by()
        .values("coupon_id")
        .annotate(n=Sum("claimed"))
    )
    return {row["coupon_id"]: row["n"] for row in rows}


def _pipeline(client: Client):
    return client.pipeline() if is_cluster(client) else client.pipeline(transaction=False)


def _fill(client: Client, temp: str, counts: Iterable[tuple[int, int]]) -> None:
    """HSET the (user id, claims) pairs into ``temp``, ``_PIPELINE_HSETS`` chunks a round trip."""
    rows = iter(counts)
    pipe = _pipeline(client)
    while chunk := dict(islice(rows, _HSET_FIELDS)):
        pipe.hset(temp, mapping=chunk)
        if len(pipe) >= _PIPELINE_HSETS:
            pipe.pexpire(temp, _TEMP_TTL_MS)
            pipe.execute()
    if len(pipe):
        pipe.pexpire(temp, _TEMP_TTL_MS)
        pipe.execute()


def gate_build_soon(*, coupon_id: int) -> threading.Thread | None:
    """For a claim that got None: rebuild the gate in a thread of this process, unless a build
    of it runs somewhere already (a lock in Redis, SET NX). Returns the thread it started."""
    client = _redis() if settings.CLAIM_GATE else None
    if client is None:
        return None
    lock, token = f"{_keys(coupon_id)[0]}:building", os.urandom(6).hex()
    try:
        if not client.set(lock, token, nx=True, px=_BUILD_LOCK_MS):
            return None
    except redis.RedisError as exc:
        _redis_failed("a build lock", exc)
        return None
    thread = threading.Thread(
        target=_build_in_background,
        args=(coupon_id, lock, token),
        name=f"{BUILD_THREAD_PREFIX}{coupon_id}",
        daemon=True,
    )
    thread.start()
    return thread


def _build_in_background(coupon_id: int, lock: str, token: str) -> None:
    try:
        gate_build(coupon_id=coupon_id)
    except Exception:
        logger.exception("claim gate: the build of coupon %s failed", coupon_id)
    finally:
        connection.close()  # this thread's own
        with contextlib.suppress(redis.RedisError):  # else the lock lapses by itself
            _UNLOCK(get_redis(), (lock,), (token,))


# --- upkeep ---------------------------------------------------------------------------------


def gates_maintain_turn() -> bool:
    """Whether this process does this round of ``gates_maintain``: one process in the fleet per
    ``GATE_MAINTAIN_INTERVAL_S`` (a key set NX that lapses after the interval)."""
    key = f"{settings.REDIS_KEY_PREFIX}:gate:maintain"
    interval_ms = int(settings.GATE_MAINTAIN_INTERVAL_S * 1000)
    return bool(get_redis().set(key, os.getpid(), nx=True, px=interval_ms))


def gates_maintain(*, now: datetime | None = None) -> list[int]:
    """Build the gates of coupons opening within ``GATE_BUILD_AHEAD_S`` and rebuild those of open
    coupons that need it; returns the coupons built.

    A gate is rebuilt when it is missing (Redis lost it), differs from its coupon (a hook's build
    failed), holds a claim reserved more than ``GATE_HOLD_STALE_S`` ago
    (its process died, or its settle or release was lost), counts other than PostgreSQL while
    nothing is in flight (drift), or is due to expire while the coupon is still on. Reading the
    state is one query and one pipeline for all coupons; only those rebuilds touch more.
    """
    if not settings.CLAIM_GATE:
        return []
    now = now or timezone.now()
    rows = list(
        Coupon.objects.filter(
            Q(status=Coupon.Status.ACTIVE)
            | Q(status=Coupon.Status.CANCELLED, updated_at__gte=now - timedelta(seconds=_KEEP_S)),
            claim_opens_at__lte=now + timedelta(seconds=settings.GATE_BUILD_AHEAD_S),
        )
        .exclude(claim_closes_at__lte=now)
        .exclude(expires_at__lte=now)
        .values("id", *_ROW_FIELDS)
    )
    if not rows:
        return []
    client = get_redis()
    claimed = _claimed_in_shards(row["id"] for row in rows)
    pipe = _pipeline(client)
    for row in rows:
        gate, _, held = _keys(row["id"])
        pipe.hmget(gate, *_GATE_FIELDS, "taken", "expires_ms")
        pipe.zrange(held, 0, 0, withscores=True)
        pipe.zcard(held)
    states = pipe.execute()
    # One clock for the staleness of every hold (cluster nodes' clocks differ by far less than
    # GATE_HOLD_STALE_S).
    server_ms = int(_SERVER_MS(client, (_keys(rows[0]["id"])[0],), ()))
    built = []
    for i, row in enumerate(rows):
        reason = _rebuild_reason(row, states[3 * i : 3 * i + 3], claimed.get(row["id"]), server_ms)
        if reason is None:
            continue
        logger.info("claim gate: building coupon %s (%s)", row["id"], reason)
        try:
            if gate_build(coupon_id=row["id"]):
                built.append(row["id"])
        except (redis.RedisError, DatabaseError):
            logger.exception("claim gate: the build of coupon %s failed", row["id"])
    return built


def _rebuild_reason(row: dict, state: list, claimed: int | None, server_ms: int) -> str | None:
    fields, oldest, in_flight = state
    *copied, taken, expires_ms = fields
    if taken is None:
        return "missing"
    if tuple(int(value or -1) for value in copied) != _gate_fields(row):
        return "changed"
    stale_before = server_ms - settings.GATE_HOLD_STALE_S * 1000
    if oldest and oldest[0][1] <= stale_before:
        return "stale holds"
    if not in_flight and claimed is not None and int(taken) != claimed:
        return "drift"
    if _expires_ms(row, server_ms) - int(expires_ms) >= _KEEP_S * 1000 // 2:
        return "expiring"
    return None
