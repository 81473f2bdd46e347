"""The claim as a request makes it: the gate in Redis first, then a grouped commit in PostgreSQL.

At a coupon's opening most claims can only be refused (not open yet, sold out, the user's limit
reached). The gate (``gate``) answers those from Redis without a database round trip and reserves
a unit for each claim it lets through; the claims it lets through in this process within a few
milliseconds are committed together (``claim_groups``). PostgreSQL stays the source of truth: a
claim answers 201 only once its row is committed, and the stock shards' check constraint and the
unique claim number guard against oversell whatever the gate says (docs/claims.md, "The gate").

A reservation is settled once its claim committed and released when it did not; one whose process
died in between is given back by the gate's reconcile. With no gate (Redis lost or flushed, the
coupon's gate not built yet, ``CLAIM_GATE`` off) the claim runs the database path alone and asks for
the gate to be rebuilt.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection
from django.utils import timezone

from . import claim_groups, gate, services
from .models import Coupon, UserCoupon
from .rules import ClaimRefused


def coupon_claim_gated(
    *,
    coupon_id: int,
    user_id: int,
    now: datetime | None = None,
    idempotency_key: str | None = None,
) -> UserCoupon:
    """Claim one coupon for ``user_id`` through the gate; raises ``ClaimRefused`` with a reason
    code, ``Coupon.DoesNotExist`` for an unknown coupon (``services.coupon_claim`` says what the
    key does)."""
    now = now or timezone.now()
    unguarded = functools.partial(
        services.coupon_claim,
        coupon_id=coupon_id,
        user_id=user_id,
        now=now,
        idempotency_key=idempotency_key,
    )
    if not settings.CLAIM_GATE or connection.in_atomic_block:
        # Inside a caller's transaction a reservation could not follow its commit.
        return unguarded()
    verdict = gate.gate_claim(coupon_id=coupon_id, user_id=user_id, now_ms=_ms(now))
    if verdict is None:
        try:
            user_coupon = unguarded()
        except Coupon.DoesNotExist:
            raise  # no gate to build for it
        except BaseException:
            gate.gate_build_soon(coupon_id=coupon_id)
            raise
        gate.gate_build_soon(coupon_id=coupon_id)
        return user_coupon
    if isinstance(verdict, gate.GateRefusal):
        raise _refused(verdict)
    try:
        user_coupon = claim_groups.claim_grouped(
            coupon_id=coupon_id,
            user_id=user_id,
            seq=verdict.seq,
            now=now,
            idempotency_key=idempotency_key,
        )
    except ClaimRefused as refused:
        # The database knows better: the gate learns it before the unit goes back.
        if refused.code == "sold_out":
            gate.gate_sold_out(coupon_id=coupon_id)
        elif refused.code == "limit_reached":
            gate.gate_user_full(coupon_id=coupon_id, user_id=user_id)
        gate.gate_release(coupon_id=coupon_id, user_id=user_id, hold=verdict.hold)
        raise
    except BaseException:
        gate.gate_release(coupon_id=coupon_id, user_id=user_id, hold=verdict.hold)
        raise
    gate.gate_settle(coupon_id=coupon_id, hold=verdict.hold)
    return user_coupon


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _moment(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _refused(refusal: gate.GateRefusal) -> ClaimRefused:
    return services.claim_refused(
        refusal.code,
        opens_at=None if refusal.opens_ms is None else _moment(refusal.opens_ms),
        closed_at=None if refusal.closes_ms is None else _moment(refusal.closes_ms),
    )
