"""The coupon domain's business rules on plain values, written once.

Whether a coupon can be claimed at a moment is asked in three places: a claim (refused with a
code), a subscription to its reminder (refused before the coupon opens), and a reminder about to be
sent (dropped when a claim at the opening could no longer succeed). All three ask ``claim_refusal``
here, on plain values (from a model instance or from a ``values()`` row), and the refusal codes
are raised as the exceptions below, which the API turns into 409 answers with the code.
"""

from __future__ import annotations

from datetime import datetime

from couponcenter.core.errors import BusinessError

ACTIVE = "active"
CANCELLED = "cancelled"
# The coupon fields the rules read (``values(*WINDOW_FIELDS, *STOCK_FIELDS)`` gives a row for them).
WINDOW_FIELDS = ("status", "claim_opens_at", "claim_closes_at", "expires_at")
STOCK_FIELDS = ("claimed_count", "total_stock")


def fields_of(coupon: object, *, stock: bool = False) -> dict:
    """The rule fields of a ``Coupon`` instance (with the stock counts when ``stock``)."""
    names = (*WINDOW_FIELDS, *STOCK_FIELDS) if stock else WINDOW_FIELDS
    return {name: getattr(coupon, name) for name in names}


def claim_refusal(
    *,
    status: str,
    claim_opens_at: datetime,
    claim_closes_at: datetime | None,
    expires_at: datetime | None,
    now: datetime,
    claimed_count: int | None = None,
    total_stock: int | None = None,
) -> str | None:
    """Why a claim at ``now`` is refused: ``cancelled``, ``not_open``, ``closed`` or (when the
    counts are given) ``sold_out``; None when it may go ahead.

    ``sold_out`` judged from ``claimed_count`` may lag the claims by a moment
    (``couponcenter.coupons.stock``); a claim itself decides on the stock shards.
    """
    if status == CANCELLED:
        return "cancelled"
    if now < claim_opens_at:
        return "not_open"
    if claim_closes_at is not None and now >= claim_closes_at:
        return "closed"
    if expires_at is not None and now >= expires_at:
        return "closed"
    if claimed_count is not None and total_stock is not None and claimed_count >= total_stock:
        return "sold_out"
    return None


def reminder_drop_reason(*, now: datetime, **coupon) -> str | None:
    """Why a reminder of this coupon can no longer help (``cancelled``, ``closed``, ``sold_out``):
    a claim at the opening time (or now, if it opened already) would be refused."""
    return claim_refusal(now=max(now, coupon["claim_opens_at"]), **coupon)


def subscribe_refusal(*, now: datetime, **coupon) -> str | None:
    """Why a reminder subscription is refused: ``cancelled``, ``closed``, or ``already_open`` (a
    reminder before the opening is the whole point)."""
    refusal = claim_refusal(now=now, **coupon)
    if refusal == "not_open":
        return None
    return refusal or "already_open"


class ClaimRefused(BusinessError):
    """Codes: ``sold_out``, ``limit_reached``, ``not_open``, ``closed``, ``cancelled``."""


class RedeemRefused(BusinessError):
    """Codes: ``expired``, ``already_used``."""


class CouponStateError(BusinessError):
    """Changing a coupon that no longer allows it (``cancelled``)."""
