"""Writes of the coupon domain: coupons, claims, redeems (API accounts are in ``accounts``).

Invariants (held by the database, not by luck):
- never more claims than ``total_stock``: a claim takes one unit from one of the coupon's stock
  shards with a conditional UPDATE (``claimed < stock``; see ``couponcenter.coupons.stock`` for the
  shards' own invariants and how ``Coupon.claimed_count`` follows them). A check constraint
  backs it up. ``sold_out`` is only answered once no shard has stock left.
- at most ``per_user_limit`` claims per (coupon, user): each claim takes the user's lowest free
  ``seq`` in ``1..per_user_limit`` and ``(coupon, user_id, seq)`` is unique, so two concurrent
  claims for the same seq cannot both commit (the loser re-reads and takes the next one).
- a claim writes its ``UserCoupon`` and ``ExpiryTask`` in one transaction (docs/claims.md).
- a redeem and the expiry sweeper race on one conditional UPDATE each (``status = 'unused'``), so
  exactly one of them wins, and a redeem also requires ``expires_at > now``.
"""

from __future__ import annotations

import functools
import random
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from couponcenter.core.db import prepared
from couponcenter.core.time import utc_text

# The one documented exception to the layering (docs/architecture.md, invariant 2): the claim
# statement writes the claim's ExpiryTask in the same transaction.
from expiry.models import ExpiryTask

from . import gate, rules, selectors, signals, stock
from .models import MAX_PER_USER_LIMIT, Coupon, CouponStockShard, UserCoupon
from .rules import ClaimRefused, CouponStateError, RedeemRefused

COUPON_FIELDS = frozenset(
    {
        "name",
        "description",
        "claim_opens_at",
        "claim_closes_at",
        "total_stock",
        "per_user_limit",
        "expires_at",
        "valid_for",
        "reminder_lead",
        "reminder_priority",
    }
)


def coupon_create(
    *,
    name: str,
    claim_opens_at: datetime,
    total_stock: int,
    claim_closes_at: datetime | None = None,
    per_user_limit: int = 1,
    expires_at: datetime | None = None,
    valid_for: timedelta | None = None,
    reminder_lead: timedelta | None = None,
    reminder_priority: str = Coupon.Priority.NORMAL,
    description: str = "",
) -> Coupon:
    """Create a coupon; raises ``ValidationError`` (field errors) and writes nothing if invalid."""
    coupon = Coupon(
        name=name,
        description=description,
        claim_opens_at=claim_opens_at,
        claim_closes_at=claim_closes_at,
        total_stock=total_stock,
        per_user_limit=per_user_limit,
        expires_at=expires_at,
        valid_for=valid_for,
        reminder_priority=reminder_priority,
    )
    if reminder_lead is not None:
        coupon.reminder_lead = reminder_lead
    coupon.full_clean(validate_constraints=False)
    # A new coupon that is already over would look active while refusing every claim.
    now = timezone.now()
    past = {
        name: ["Must be in the future: every claim would be refused."]
        for name in ("claim_closes_at", "expires_at")
        if getattr(coupon, name) is not None and getattr(coupon, name) <= now
    }
    if past:
        raise ValidationError(past)
    with transaction.atomic():
        coupon.save()
        stock.stock_shards_create(coupon=coupon)
        _gate_build_on_commit(coupon.pk)
    return coupon


def coupon_update(*, coupon: Coupon, **fields: Any) -> Coupon:
    """Change a coupon; moving its opening time (or reminder lead) moves its reminders.

    Raises ``ValidationError`` (nothing changes) or ``CouponStateError("cancelled")``.
    """
    unknown = set(fields) - COUPON_FIELDS
    if unknown:
        raise TypeError(f"unknown coupon fields: {sorted(unknown)}")
    with transaction.atomic():
        # The coupon and shard row locks keep the claims still while total_stock is checked
        # against them and the stock left is re-cut over the shards.
        coupon = Coupon.objects.select_for_update(no_key=True).get(pk=coupon.pk)
        if coupon.status == Coupon.Status.CANCELLED:
            raise CouponStateError("cancelled", "A cancelled coupon cannot be changed.")
        shards = stock.stock_lock(coupon=coupon)
        before = (coupon.claim_opens_at, coupon.reminder_lead)
        gate_before = [getattr(coupon, name) for name in gate.GATE_COUPON_FIELDS]
        stock_before = coupon.total_stock
        for name, value in fields.items():
            setattr(coupon, name, value)
        coupon.full_clean(validate_constraints=False)
        coupon.save(update_fields=[*fields, "claimed_count", "updated_at"])
        if coupon.total_stock != stock_before:
            stock.stock_recut(coupon=coupon, shards=shards)
        if (coupon.claim_opens_at, coupon.reminder_lead) != before:
            signals.coupon_rescheduled.send(sender=Coupon, coupon=coupon)
        reason = rules.reminder_drop_reason(
            now=timezone.now(), **rules.fields_of(coupon, stock=True)
        )
        if reason:
            signals.coupon_unclaimable.send(sender=Coupon, coupon=coupon, reason=reason)
        if [getattr(coupon, name) for name in gate.GATE_COUPON_FIELDS] != gate_before:
            _gate_build_on_commit(coupon.pk)
    return coupon


def coupon_cancel(*, coupon: Coupon) -> Coupon:
    """Cancel a coupon: no more claims, and its pending reminders are cancelled. Idempotent."""
    with transaction.atomic():
        # Closing the shards under their locks is what stops the claims in flight.
        locked = Coupon.objects.select_for_update(no_key=True).get(pk=coupon.pk)
        if locked.status == Coupon.Status.ACTIVE:
            stock.stock_close(shards=stock.stock_lock(coupon=locked))
            locked.status = Coupon.Status.CANCELLED
            locked.save(update_fields=["status", "claimed_count", "updated_at"])
            signals.coupon_cancelled.send(sender=Coupon, coupon=locked)
            _gate_build_on_commit(locked.pk)
    coupon.refresh_from_db()
    return coupon


def _gate_build_on_commit(coupon_id: int) -> None:
    """Rebuild the coupon's claim gate once the change is committed (``robust``: a failed build
    is logged, never the change's error; gates_maintain sees the gate is out of date and builds
    it again). A redeem changes nothing the gate holds: ``per_user_limit`` counts the claims a
    user ever made, not the coupons they still hold, so redeems call nothing here."""
    if settings.CLAIM_GATE:
        transaction.on_commit(functools.partial(gate.gate_build, coupon_id=coupon_id), robust=True)


def _window_refusal(*, coupon: Coupon, now: datetime) -> str | None:
    return rules.claim_refusal(now=now, **rules.fields_of(coupon))


def _refused(code: str, coupon: Coupon | None = None) -> ClaimRefused:
    """The refusal with what a client needs to act on it: when claims open or closed."""
    if coupon is None:
        return claim_refused(code)
    ends = [t for t in (coupon.claim_closes_at, coupon.expires_at) if t is not None]
    return claim_refused(code, opens_at=coupon.claim_opens_at, closed_at=min(ends, default=None))


def claim_refused(
    code: str, *, opens_at: datetime | None = None, closed_at: datetime | None = None
) -> ClaimRefused:
    """A claim's refusal: ``not_open`` says when claims open, ``closed`` when they closed."""
    if code == "not_open" and opens_at is not None:
        opens = utc_text(opens_at)
        return ClaimRefused(code, f"Claims open at {opens}.", opens_at=opens)
    if code == "closed" and closed_at is not None:
        closed = utc_text(closed_at)
        return ClaimRefused(code, f"Claims closed at {closed}.", closed_at=closed)
    messages = {
        "cancelled": "The coupon was cancelled.",
        "sold_out": "Every unit of the coupon's stock has been claimed.",
        "limit_reached": "This user has claimed the coupon as often as its per-user limit allows.",
    }
    return ClaimRefused(code, messages.get(code, ""))


def coupon_claim(
    *,
    coupon_id: int,
    user_id: int,
    now: datetime | None = None,
    idempotency_key: str | None = None,
) -> UserCoupon:
    """Claim one coupon for ``user_id``; raises ``ClaimRefused`` with a reason code.

    ``idempotency_key``: stored on the user coupon, unique per (coupon, user). A claim whose key
    is already on one of the user's coupons claims nothing and returns that one (its
    ``claimed_at`` is then earlier than ``now``).

    Raises ``Coupon.DoesNotExist`` for an unknown coupon.
    """
    # Most claims are a user's first, so seq 1 is tried without reading the user's claims.
    return claim_one(
        coupon_id=coupon_id,
        user_id=user_id,
        seq=1,
        now=now or timezone.now(),
        idempotency_key=idempotency_key,
    )


def claim_one(
    *,
    coupon_id: int,
    user_id: int,
    seq: int | None,
    now: datetime,
    idempotency_key: str | None = None,
) -> UserCoupon:
    """One claim in statements of its own, trying ``seq`` first (None: the user's lowest free
    seq, read first); raises as ``coupon_claim``."""
    claim = functools.partial(
        _claim,
        coupon_id=coupon_id,
        user_id=user_id,
        seq=seq,
        now=now,
        idempotency_key=idempotency_key,
    )
    if connection.vendor != "postgresql":
        return claim()
    if connection.in_atomic_block:
        user_coupon = claim()
        stock.coupon_claimed_count_fold(coupon_id=coupon_id)
        return user_coupon
    with stock.claimed_count_folding(coupon_id=coupon_id) as outcome:
        user_coupon = claim()
        outcome.committed = True
    return user_coupon


def _claim(
    *,
    coupon_id: int,
    user_id: int,
    seq: int | None,
    now: datetime,
    idempotency_key: str | None = None,
) -> UserCoupon:
    # An IntegrityError means that seq is taken (by an earlier or a concurrent claim), or that
    # the key is: the next try reads the user's claims, and after per_user_limit of them the
    # claim is refused.
    claim_once = functools.partial(
        _claim_once, coupon_id=coupon_id, user_id=user_id, now=now, idempotency_key=idempotency_key
    )
    if seq is None:
        seq = _free_seq(coupon_id=coupon_id, user_id=user_id)
    for _ in range(MAX_PER_USER_LIMIT):
        try:
            return claim_once(seq=seq)
        except IntegrityError:
            if idempotency_key is not None:
                earlier = selectors.user_coupon_with_idempotency_key(
                    coupon_id=coupon_id, user_id=user_id, idempotency_key=idempotency_key
                )
                if earlier is not None:
                    return earlier
            seq = _free_seq(coupon_id=coupon_id, user_id=user_id)
    return claim_once(seq=seq)


def _claim_once(
    *, coupon_id: int, user_id: int, seq: int, now: datetime, idempotency_key: str | None = None
) -> UserCoupon:
    claim_once = (
        _claim_once_one_statement if connection.vendor == "postgresql" else _claim_once_serialized
    )
    return claim_once(
        coupon_id=coupon_id, user_id=user_id, seq=seq, now=now, idempotency_key=idempotency_key
    )


def _claim_once_serialized(
    *, coupon_id: int, user_id: int, seq: int, now: datetime, idempotency_key: str | None = None
) -> UserCoupon:
    """Other databases (SQLite): writers run one at a time anyway, so no row is hot, and
    ``claimed_count`` is folded in the claim's own transaction."""
    coupon = Coupon.objects.get(pk=coupon_id)
    # Fail fast without a transaction; the conditional UPDATE below is what actually decides.
    refusal = _window_refusal(coupon=coupon, now=now)
    if refusal:
        raise _refused(refusal, coupon)
    if not CouponStockShard.objects.filter(coupon_id=coupon_id).exists():
        stock.stock_shards_ensure(coupon_id=coupon_id)
    with transaction.atomic():
        expires_at = coupon.expires_at or now + coupon.valid_for
        user_coupon = UserCoupon.objects.create(
            coupon=coupon,
            user_id=user_id,
            seq=seq,
            claimed_at=now,
            expires_at=expires_at,
            idempotency_key=idempotency_key,
        )
        ExpiryTask.objects.create(user_coupon=user_coupon, expire_at=expires_at)
        shards = list(
            CouponStockShard.objects.filter(
                coupon_id=coupon_id, claimed__lt=F("stock")
            ).values_list("pk", flat=True)
        )
        taken = shards and CouponStockShard.objects.filter(
            pk=random.choice(shards), claimed__lt=F("stock")
        ).update(claimed=F("claimed") + 1)
        if not taken:
            coupon.refresh_from_db()
            raise _refused(_window_refusal(coupon=coupon, now=now) or "sold_out", coupon)
        stock.coupon_claimed_count_fold(coupon_id=coupon_id)
    return user_coupon


# PostgreSQL: the whole claim is one statement, so in autocommit it is its own transaction. The
# statement locks one shard with stock left, skipping shards other claims hold, and keeps that
# lock until its commit is durable; the lock is taken and released inside the server, never across
# a client round trip (a web worker descheduled while holding it would stall the shard). The
# conditions are the same as ``rules.claim_refusal``'s; the unique (coupon, user_id, seq) constraint
# fails the statement as a whole (the shard's increment included) when the seq is taken. The
# shards are tried from a random one on, so concurrent claims start on different rows.
_CLAIM_SQL = """
WITH coupon AS (
    SELECT id, name, COALESCE(expires_at, %(now)s + valid_for) AS expires_at FROM {coupon}
    WHERE id = %(coupon_id)s AND status = %(active)s
      AND claim_opens_at <= %(now)s
      AND (claim_closes_at IS NULL OR claim_closes_at > %(now)s)
      AND (expires_at IS NULL OR expires_at > %(now)s)
), pick AS (
    SELECT s.id FROM {shard} s
    WHERE s.coupon_id = %(coupon_id)s AND s.claimed < s.stock AND EXISTS (SELECT 1 FROM coupon)
    ORDER BY s.shard < %(start)s, s.shard
    LIMIT 1 FOR UPDATE OF s {skip_locked}
), taken AS (
    UPDATE {shard} s SET claimed = s.claimed + 1 FROM pick WHERE s.id = pick.id
    RETURNING s.id
), claimed AS (
    INSERT INTO {user_coupon}
        (coupon_id, user_id, seq, status, claimed_at, expires_at, idempotency_key)
    SELECT coupon.id, %(user_id)s, %(seq)s, %(unused)s, %(now)s, coupon.expires_at,
        %(idempotency_key)s
    FROM coupon, taken
    RETURNING id, expires_at
), task AS (
    INSERT INTO {task} (user_coupon_id, expire_at, status, created_at, updated_at)
    SELECT id, expires_at, %(pending)s, %(now)s, %(now)s FROM claimed
)
SELECT claimed.id, claimed.expires_at, coupon.name FROM claimed, coupon
"""

# How often a claim that found no free shard re-reads the stock and waits for a busy shard before
# it gives up; each miss means other claims took the units it saw, so this is never reached
# before the stock really runs out unless the stock is being raised at the same time.
_MAX_WAITS = 100


def _claim_once_one_statement(
    *, coupon_id: int, user_id: int, seq: int, now: datetime, idempotency_key: str | None = None
) -> UserCoupon:
    statement = functools.partial(
        _claim_statement,
        coupon_id=coupon_id,
        user_id=user_id,
        seq=seq,
        now=now,
        idempotency_key=idempotency_key,
    )
    row = statement(wait=False)
    for _ in range(_MAX_WAITS):
        if row is not None:
            break
        # Nothing taken: the coupon is not claimable, it is sold out (or not sharded yet), or
        # every shard with stock left was held by another claim. Only the last is worth a wait.
        # The shards before the coupon: a cancel closes them in the transaction that cancels
        # the coupon, so closed shards read here come with the cancel, and its reason.
        left = stock.stock_left(coupon_id=coupon_id)
        coupon = Coupon.objects.get(pk=coupon_id)
        refusal = _window_refusal(coupon=coupon, now=now)
        if refusal:
            raise _refused(refusal, coupon)
        if not left:
            raise _refused("sold_out")
        row = statement(wait=True)
    if row is None:
        raise _refused("sold_out")
    return _claimed(
        coupon_id=coupon_id,
        coupon_name=row[2],
        user_id=user_id,
        seq=seq,
        now=now,
        pk=row[0],
        expires_at=row[1],
        idempotency_key=idempotency_key,
    )


def _claimed(
    *,
    coupon_id: int,
    coupon_name: str,
    user_id: int,
    seq: int,
    now: datetime,
    pk: int,
    expires_at: datetime,
    idempotency_key: str | None = None,
) -> UserCoupon:
    """The user coupon a claim statement inserted, built from what the statement returned."""
    user_coupon = UserCoupon(
        id=pk,
        coupon_id=coupon_id,
        user_id=user_id,
        seq=seq,
        claimed_at=now,
        expires_at=expires_at,
        idempotency_key=idempotency_key,
    )
    user_coupon._state.adding = False
    user_coupon._state.db = connection.alias
    # The coupon as far as the statement read it: its other fields load on first access.
    user_coupon.coupon = Coupon.from_db(connection.alias, ["id", "name"], [coupon_id, coupon_name])
    return user_coupon


def _claim_statement(
    *,
    coupon_id: int,
    user_id: int,
    seq: int,
    now: datetime,
    idempotency_key: str | None = None,
    wait: bool,
) -> tuple | None:
    params = {
        "coupon_id": coupon_id,
        "user_id": user_id,
        "seq": seq,
        "now": now,
        "idempotency_key": idempotency_key,
        "start": 0 if wait else random.randrange(stock.shard_count()),
        "active": Coupon.Status.ACTIVE,
        "unused": UserCoupon.Status.UNUSED,
        "pending": ExpiryTask.Status.PENDING,
    }
    # A waiting claim may keep the lock of a shard it found empty after the wait while it waits
    # for the next one, so waiting claims go through the shards in one order (from shard 0):
    # in random orders two of them could each hold the shard the other waits for.
    # Inside a caller's transaction, a failed statement must only roll back to a savepoint.
    savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with savepoint, connection.cursor() as cursor:
        prepared.execute(cursor, _claim_prepared(wait), params)
        return cursor.fetchone()


@functools.cache
def _claim_prepared(wait: bool) -> prepared.Prepared:
    """The claim statement, prepared on each connection that runs it (see
    ``couponcenter.core.db.prepared``: its planning cost more than running it)."""
    return prepared.Prepared(
        "cc_claim_wait" if wait else "cc_claim",
        _claim_sql(_CLAIM_SQL, wait=wait),
        (
            ("coupon_id", "bigint"),
            ("user_id", "bigint"),
            ("seq", "integer"),
            ("now", "timestamptz"),
            ("start", "integer"),
            ("active", "text"),
            ("unused", "text"),
            ("pending", "text"),
            ("idempotency_key", "text"),
        ),
    )


def _claim_sql(template: str, *, wait: bool) -> str:
    """A claim statement's text: its tables, and whether it waits for a busy shard."""
    quote = connection.ops.quote_name
    return template.format(
        coupon=quote(Coupon._meta.db_table),
        shard=quote(CouponStockShard._meta.db_table),
        user_coupon=quote(UserCoupon._meta.db_table),
        task=quote(ExpiryTask._meta.db_table),
        skip_locked="" if wait else "SKIP LOCKED",
    )


def _free_seq(*, coupon_id: int, user_id: int) -> int:
    """The lowest free claim slot 1..per_user_limit of this user, or ``limit_reached``."""
    limit = Coupon.objects.values_list("per_user_limit", flat=True).get(pk=coupon_id)
    taken = set(
        UserCoupon.objects.filter(coupon_id=coupon_id, user_id=user_id).values_list(
            "seq", flat=True
        )
    )
    if len(taken) >= limit:
        raise _refused("limit_reached")
    return next(seq for seq in range(1, limit + 1) if seq not in taken)


def coupon_redeem(*, user_coupon_id: int, user_id: int, now: datetime | None = None) -> UserCoupon:
    """Use a claimed coupon; raises ``RedeemRefused`` (``expired``, ``already_used``).

    Raises ``UserCoupon.DoesNotExist`` if ``user_id`` holds no such coupon.
    """
    now = now or timezone.now()
    with transaction.atomic():
        used = UserCoupon.objects.filter(
            pk=user_coupon_id,
            user_id=user_id,
            status=UserCoupon.Status.UNUSED,
            expires_at__gt=now,
        ).update(status=UserCoupon.Status.USED, used_at=now)
        user_coupon = UserCoupon.objects.select_related("coupon").get(
            pk=user_coupon_id, user_id=user_id
        )
        if not used:
            if user_coupon.status == UserCoupon.Status.USED:
                used_at = utc_text(user_coupon.used_at) if user_coupon.used_at else None
                raise RedeemRefused("already_used", f"Already used at {used_at}.", used_at=used_at)
            expired = utc_text(user_coupon.expires_at)
            raise RedeemRefused("expired", f"Expired at {expired}.", expired_at=expired)
        ExpiryTask.objects.filter(
            user_coupon_id=user_coupon_id, status=ExpiryTask.Status.PENDING
        ).update(status=ExpiryTask.Status.PROCESSED, updated_at=now)
    return user_coupon
