"""The claim as a request makes it: the gate in Redis first, then a grouped commit in PostgreSQL.

At a coupon's opening most claims can only be refused (not open yet, sold out, the user's limit
reached). The gate (``gate``) answers those from Redis (or, for a refusal it gave every user of
the coupon a moment ago, from this process's memory) without a database round trip, and reserves
a unit for each claim it lets through. The claims of one coupon running in this process within a
few milliseconds ask the gate together and are committed together (``claim_groups``): one Redis
round trip, one statement and one settle for the whole group. PostgreSQL stays the source of
truth: a claim answers 201 only once its row is committed, and the stock shards' check constraint
and the unique claim number guard against oversell whatever the gate says (docs/claims.md, "The
gate").

A reservation is settled once its claim committed and released when it did not; one whose process
died in between is given back by the gate's reconcile. With no gate (Redis lost or flushed, the
coupon's gate not built yet, ``CLAIM_GATE`` off) the claim runs the database path alone and asks for
the gate to be rebuilt.
"""

from __future__ import annotations

import functools
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.utils import timezone

from . import claim_groups, gate, services
from .models import Coupon, UserCoupon


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
    # A refusal this process already had for every user of the coupon joins no group.
    remembered = gate.gate_remembered(coupon_id=coupon_id, now_ms=gate.ms_of(now))
    if remembered is not None:
        raise claim_groups.gate_refused(remembered)
    try:
        return claim_groups.claim_grouped(
            coupon_id=coupon_id,
            user_id=user_id,
            seq=None,
            now=now,
            idempotency_key=idempotency_key,
            gated=True,
        )
    except claim_groups.NoGate:
        pass
    try:
        user_coupon = unguarded()
    except Coupon.DoesNotExist:
        raise  # no gate to build for it
    except BaseException:
        gate.gate_build_soon(coupon_id=coupon_id)
        raise
    gate.gate_build_soon(coupon_id=coupon_id)
    return user_coupon
