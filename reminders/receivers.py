"""How reminders follow their coupons: receivers of the coupon domain's signals, connected in
``reminders/apps.py``. They run inside the coupon service's transaction and only delegate."""

from __future__ import annotations

from typing import Any

from couponcenter.coupons.models import Coupon
from reminders.services import (
    subscriptions_cancel_for_coupon,
    subscriptions_drop_for_coupon,
    subscriptions_reschedule_for_coupon,
)


def on_coupon_rescheduled(sender: type[Coupon], *, coupon: Coupon, **kwargs: Any) -> None:
    subscriptions_reschedule_for_coupon(coupon=coupon)


def on_coupon_cancelled(sender: type[Coupon], *, coupon: Coupon, **kwargs: Any) -> None:
    subscriptions_cancel_for_coupon(coupon=coupon)


def on_coupon_unclaimable(
    sender: type[Coupon], *, coupon: Coupon, reason: str, **kwargs: Any
) -> None:
    subscriptions_drop_for_coupon(coupon=coupon, reason=reason)
