"""Helpers shared by the console tests (Django test client and browser): real rows, real Redis.

``overdue_reminders`` subscribes users to a coupon whose reminder time has already passed, so the
entries sit in the store, due now; ``kill_reminders`` drives them to the dead queue through the
engine's own claim and bury scripts and marks the rows FAILED, as delivery does after the last
attempt.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from reminders.engine import keys, queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from reminders.members import member as reminder_member
from reminders.models import ReminderSubscription, TimeoutJob
from reminders.services import subscription_subscribe
from tests.support.factories import CouponFactory


def overdue_reminders(user_ids, *, overdue_s: int = 30) -> list[ReminderSubscription]:
    """Subscriptions whose reminders were due ``overdue_s`` seconds ago (lead 60 s)."""
    coupon = CouponFactory(
        claim_opens_at=timezone.now() + timedelta(seconds=60 - overdue_s),
        reminder_lead=timedelta(seconds=60),
    )
    subs = []
    for user_id in user_ids:
        with transaction.atomic():  # outside a test transaction, commits (and indexes) each
            sub, _ = subscription_subscribe(user_id=user_id, coupon=coupon)
        subs.append(sub)
    return subs


def member(sub: ReminderSubscription) -> str:
    return reminder_member(sub.pk)


def kill_reminders(subs, *, error: str = "gateway said 503") -> None:
    """Claim every due entry of these subscriptions' slots and bury them (dead), rows FAILED."""
    client = scripts_client()
    by_slot: dict[int, list[str]] = {}
    for sub in subs:
        by_slot.setdefault(sub.slot, []).append(member(sub))
    for slot, members in by_slot.items():
        token = scripts.lease_acquire(
            client, keys.slot_keys(REMINDER_TOPIC, slot), holder="console-test", ttl_ms=60_000
        )
        queue.claim(REMINDER_TOPIC, slot, now_ms=10**13, limit=10_000, visibility_ms=60_000,
                    lease_token=token)  # fmt: skip
        queue.bury(REMINDER_TOPIC, slot, [(m, error) for m in members], now_ms=epoch_ms(),
                   lease_token=token)  # fmt: skip
        scripts.lease_release(client, keys.slot_keys(REMINDER_TOPIC, slot).lease, token=token)
    ReminderSubscription.objects.filter(pk__in=[s.pk for s in subs]).update(
        status=ReminderSubscription.Status.FAILED
    )


def kill_timeout_jobs(jobs, *, error: str = "HTTP 503") -> None:
    """These timeout jobs dead in Redis and in their rows, as a worker leaves one past its
    attempts; whatever else of their slots the claim took goes back, due as it was."""
    client = scripts_client()
    by_slot: dict[tuple[str, int], set[str]] = {}
    for job in jobs:
        by_slot.setdefault((job.topic, job.slot), set()).add(str(job.pk))
    for (topic, slot), ids in by_slot.items():
        k = keys.slot_keys(topic, slot)
        token = scripts.lease_acquire(client, k, holder="console-test", ttl_ms=60_000)
        # Whatever is due within a day (a far later "now" would overflow the prepare scores
        # that unclaim checks: deadline * 1000 + attempt must stay an exact double).
        claimed = queue.claim(topic, slot, now_ms=epoch_ms() + 86_400_000, limit=10_000,
                              visibility_ms=60_000, lease_token=token)  # fmt: skip
        queue.bury(topic, slot, [(i, error) for i in ids], now_ms=epoch_ms(), lease_token=token)
        queue.unclaim(topic, slot, [c for c in claimed if c.job_id not in ids])
        scripts.lease_release(client, k.lease, token=token)
    TimeoutJob.objects.filter(pk__in=[j.pk for j in jobs]).update(
        status=TimeoutJob.Status.DEAD, attempts=1, last_error=error
    )


def dead_members() -> set[str]:
    return {
        d.job_id
        for slot in range(queue.served_slot_count(REMINDER_TOPIC, 1))
        for d in queue.list_dead(REMINDER_TOPIC, slot, limit=10_000)
    }


def scripts_client():
    from couponcenter.core.redis import get_redis

    return get_redis()
