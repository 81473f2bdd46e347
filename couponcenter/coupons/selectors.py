"""Reads of the coupon domain."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, F, Q, QuerySet, Sum
from django.utils import timezone

from .models import Coupon, CouponStockShard, UserCoupon


def coupon_list(
    *, upcoming: bool | None = None, claimable: bool | None = None, now: datetime | None = None
) -> QuerySet[Coupon]:
    """The catalogue; ``upcoming``: active, not open yet; ``claimable``: open now, stock left."""
    now = now or timezone.now()
    qs = Coupon.objects.all()
    open_now = (
        Q(status=Coupon.Status.ACTIVE, claim_opens_at__lte=now)
        & (Q(claim_closes_at__isnull=True) | Q(claim_closes_at__gt=now))
        & (Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    )
    if upcoming is True:
        qs = qs.filter(status=Coupon.Status.ACTIVE, claim_opens_at__gt=now)
    elif upcoming is False:
        qs = qs.exclude(status=Coupon.Status.ACTIVE, claim_opens_at__gt=now)
    if claimable is True:
        qs = qs.filter(open_now).filter(claimed_count__lt=F("total_stock"))
    elif claimable is False:
        qs = qs.exclude(open_now & Q(claimed_count__lt=F("total_stock")))
    return qs


def coupon_claims_count(*, coupon: Coupon) -> int:
    """The exact number of claims of ``coupon``, from its stock shards.

    ``Coupon.claimed_count`` trails the shards by the claims committed but not folded yet (a
    moment, ``couponcenter.coupons.stock``); a coupon not sharded yet has only the claims in
    that column.
    """
    total = CouponStockShard.objects.filter(coupon_id=coupon.pk).aggregate(n=Sum("claimed"))["n"]
    return coupon.claimed_count if total is None else total


def user_coupon_list(*, user_id: int, status: str | None = None) -> QuerySet[UserCoupon]:
    """A user's claimed coupons, newest first."""
    qs = UserCoupon.objects.filter(user_id=user_id).select_related("coupon")
    if status:
        qs = qs.filter(status=status)
    return qs


def coupon_claim_status_counts(*, coupon_id: int) -> dict[str, int]:
    """Redeemed (``used``) and ``expired`` claims of one coupon, through the unique
    (coupon, user_id, seq) index: about 0.1 s for a coupon with 1M claims. For one coupon's page
    only, never per row of a list."""
    statuses = [UserCoupon.Status.USED, UserCoupon.Status.EXPIRED]
    counts = dict(
        UserCoupon.objects.filter(coupon_id=coupon_id, status__in=statuses)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    return {status: counts.get(status, 0) for status in statuses}


def user_coupon_with_idempotency_key(
    *, coupon_id: int, user_id: int, idempotency_key: str
) -> UserCoupon | None:
    """The user's coupon claimed with ``idempotency_key`` (unique per coupon and user), if any."""
    return (
        UserCoupon.objects.select_related("coupon")
        .filter(coupon_id=coupon_id, user_id=user_id, idempotency_key=idempotency_key)
        .first()
    )
