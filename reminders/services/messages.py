"""A delivery batch's reminders as messages, for the inbox and the external gateways alike.

Each reminder is read from its row (an ``Item``); those whose coupon can no longer help are
``dropped`` with the reason (``drop_hopeless``); the rest are merged, a user's reminders of one
merge window into one ``Message`` (``merge``), whose ``dedup_key`` is made of the sorted
subscription ids, so a redelivered message is the same message.
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from couponcenter.core.caching import TTLCache
from couponcenter.core.db.row_movement import retry_if_moved
from couponcenter.core.time import utc_text
from couponcenter.coupons import rules
from couponcenter.coupons.models import Coupon
from reminders.engine.clock import epoch_ms
from reminders.gateways import Message
from reminders.models import ReminderSubscription

Status = ReminderSubscription.Status
COUPON_TTL_S = 5.0  # names and opening times in messages may lag an edit by this much
# Coupon states (cancelled, sold out) are re-read at most this often per process: a hot coupon
# is in every batch of a burst.
COUPON_STATE_TTL_S = 1.0
# A row due this much later than the clock says was not due when its entry fired (clocks of the
# dispatching and delivering hosts may differ by less): it is put back, not sent.
EARLY_TOLERANCE_S = 5.0


@dataclass
class Item:
    member: str
    sub_id: int
    user_id: int
    remind_at: datetime
    coupon_id: int
    traceparent: str = ""  # the subscribing call's trace (core.tracing)


@dataclass
class Group:
    """One message: a user's reminders of one merge window."""

    user_id: int
    items: list[Item]
    message: Message


# --- what can no longer help ---------------------------------------------------------------------


def coupon_drop_reasons(coupon_ids: set[int], *, now: datetime) -> dict[int, str | None]:
    """Why reminders of each coupon should be dropped (None: still worth sending), from a
    per-process cache of at most ``COUPON_STATE_TTL_S``."""

    def load(missing: set[int]) -> dict[int, str | None]:
        rows = Coupon.objects.filter(pk__in=missing).values(
            "pk", *rules.WINDOW_FIELDS, *rules.STOCK_FIELDS
        )
        found = {row.pop("pk"): rules.reminder_drop_reason(now=now, **row) for row in rows}
        return {coupon_id: found.get(coupon_id, "deleted") for coupon_id in missing}

    return _drop_reasons.get_many(coupon_ids, load)


_drop_reasons: TTLCache[int, str | None] = TTLCache(COUPON_STATE_TTL_S)


def drop_hopeless(items: list[Item], now: datetime, *, marked: str) -> tuple[list[Item], int]:
    """Items whose coupon can no longer help are ``dropped`` with the reason; the rest are
    returned with how many were dropped. ``marked``: the status their rows have now (the inbox
    marked them ``sent`` in this transaction, so the mark is overwritten before anyone sees
    it; an external gateway has not sent them yet, so they are still ``scheduled``)."""
    reasons = coupon_drop_reasons({item.coupon_id for item in items}, now=now)
    if not any(reasons.values()):
        return items, 0
    kept, dropped = [], defaultdict(list)
    for item in items:
        reason = reasons[item.coupon_id]
        if reason:
            dropped[reason].append(item.sub_id)
        else:
            kept.append(item)
    count = 0
    for reason, sub_ids in dropped.items():
        rows = ReminderSubscription.objects.filter(pk__in=sub_ids, status=marked)
        count += retry_if_moved(
            functools.partial(
                rows.update,
                status=Status.DROPPED,
                drop_reason=reason,
                sent_at=None,
                updated_at=now,
            )
        )
    return kept, count


# --- merging into messages -----------------------------------------------------------------------


def merge(items: list[Item], window_ms: int) -> list[Group]:
    by_key: dict[tuple[int, int], list[Item]] = defaultdict(list)
    window = max(window_ms, 1)
    for item in items:
        by_key[(item.user_id, bucket(item.remind_at, window))].append(item)
    coupons = _coupon_info({item.coupon_id for item in items})
    # One clock reading per batch, and each opening's words worked out once: a burst is
    # thousands of messages a batch about one coupon, and the local-time conversion is the
    # costly part of a message.
    now = timezone.now()
    whens: dict[datetime | None, str] = {}
    return [
        Group(user_id, group_items, _message(user_id, group_items, coupons, now, whens))
        for (user_id, _), group_items in by_key.items()
    ]


def bucket(moment: datetime, window_ms: int) -> int:
    """The merge window ``moment`` falls in: reminders of one user and one bucket are one
    message."""
    return epoch_ms(moment) // window_ms


@dataclass(frozen=True)
class CouponInfo:
    """What a message says about a coupon, prepared once per coupon, not once per reminder."""

    name: str
    opens_at: datetime | None
    payload: dict[str, Any]


_UNKNOWN = CouponInfo("a coupon", None, {"id": None, "name": "a coupon"})


_coupons: TTLCache[int, CouponInfo] = TTLCache(COUPON_TTL_S)


def _coupon_info(coupon_ids: set[int]) -> dict[int, CouponInfo]:
    """Per coupon, from a short per-process cache (a hot coupon is in every batch)."""

    def load(missing: set[int]) -> dict[int, CouponInfo]:
        rows = Coupon.objects.filter(pk__in=missing).values_list("pk", "name", "claim_opens_at")
        return {
            pk: CouponInfo(
                name, opens_at, {"id": pk, "name": name, "claim_opens_at": utc_text(opens_at)}
            )
            for pk, name, opens_at in rows
        }

    return _coupons.get_many(coupon_ids, load)


def _when(opens_at: datetime | None, now: datetime) -> str:
    """Words that stay true however late the message is read: the opening as a clock time (the
    payload carries the exact time for the client's own zone), or that it is open already."""
    if opens_at is None or opens_at <= now:
        return "now"
    local = timezone.localtime(_whole_second_up(opens_at))
    day = "" if local.date() == timezone.localtime(now).date() else f"{local:%Y-%m-%d} "
    clock = f"{local:%H:%M}" if local.second == 0 else f"{local:%H:%M:%S}"
    return f"at {day}{clock} {local.tzname()}"


def _whole_second_up(moment: datetime) -> datetime:
    """Rounded up, never down: a user who taps at the time shown must find the coupon open."""
    if moment.microsecond == 0:
        return moment
    return moment.replace(microsecond=0) + timedelta(seconds=1)


def _message(
    user_id: int,
    items: list[Item],
    coupons: dict[int, CouponInfo],
    now: datetime,
    whens: dict[datetime | None, str],
) -> Message:
    """``whens``: opening -> its words at ``now``, filled in as openings come up."""
    info = [coupons.get(item.coupon_id, _UNKNOWN) for item in items]
    opens_at = min((c.opens_at for c in info if c.opens_at), default=None)
    when = whens.get(opens_at)
    if when is None:
        when = whens[opens_at] = _when(opens_at, now)
    if len(info) == 1:
        name = info[0].name
        title = f"{name} is open now" if when == "now" else f"{name} opens {when}"
        body = name
        sub_ids = [items[0].sub_id]
    else:
        if when == "now":
            title = f"{len(info)} coupons you follow are open now"
        else:
            title = f"{len(info)} coupons you follow open {when}"
        body = ", ".join(c.name for c in info)
        sub_ids = sorted(item.sub_id for item in items)
    key = "reminder:" + "-".join(map(str, sub_ids))
    if len(key) > 190:
        key = "reminder:h:" + hashlib.sha1(key.encode()).hexdigest()
    return Message(
        user_id=user_id,
        dedup_key=key,
        title=title,
        body=body,
        payload={"coupons": [c.payload for c in info], "subscriptions": sub_ids},
    )
