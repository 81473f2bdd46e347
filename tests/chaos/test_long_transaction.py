"""Chaos: a long-open transaction holds row locks on expiry tasks and on user coupons while a
real ``run_expiry_sweeper`` process works.

The sweeper skips what is locked (``SKIP LOCKED`` on both tables), keeps expiring everything
else, and expires the locked rows once the transaction ends: by a ROLLBACK, or by PostgreSQL's
``idle_in_transaction_session_timeout`` ending a session that went idle holding them (the advice
in the README: set it for the application's role).
"""

from __future__ import annotations

import sys
from datetime import timedelta

import psycopg2
import pytest
from django.db import connection
from django.utils import timezone

from couponcenter.coupons.models import UserCoupon
from expiry import selectors
from expiry import services as expiry_services
from expiry.models import ExpiryTask
from tests.chaos.conftest import wait_for
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DUE = 3000
BATCH = 100
LOCKED_TASKS = 50  # locked directly (FOR UPDATE on expiry_expirytask)
LOCKED_COUPONS = 2 * BATCH  # their user coupons locked, more than a whole batch at the head


def _due_claims() -> list[int]:
    """``DUE`` claimed coupons, long due, oldest first; returns the expiry task ids in due order."""
    now = timezone.now()
    coupon = CouponFactory(name="Long due", total_stock=DUE)
    claims = UserCoupon.objects.bulk_create(
        UserCoupon(coupon=coupon, user_id=700_000 + i, claimed_at=now - timedelta(days=8),
                   expires_at=now - timedelta(hours=1) + timedelta(milliseconds=i))
        for i in range(DUE)
    )  # fmt: skip
    tasks = ExpiryTask.objects.bulk_create(
        ExpiryTask(user_coupon=uc, expire_at=uc.expires_at) for uc in claims
    )
    return [t.pk for t in tasks]


def _holder(**options) -> psycopg2.extensions.connection:
    db = connection.settings_dict
    return psycopg2.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432,
                            user=db["USER"], password=db["PASSWORD"] or None,
                            dbname=db["NAME"], **options)  # fmt: skip


def _lock(holder, task_ids: list[int]) -> None:
    """BEGIN; lock the head of the due queue (tasks, and other tasks' user coupons); go idle."""
    with holder.cursor() as cur:
        cur.execute("SELECT id FROM expiry_expirytask WHERE id = ANY(%s) FOR UPDATE",
                    [task_ids[:LOCKED_TASKS]])  # fmt: skip
        cur.execute(
            "SELECT uc.id FROM couponcenter_usercoupon uc JOIN expiry_expirytask t "
            "ON t.user_coupon_id = uc.id WHERE t.id = ANY(%s) FOR UPDATE OF uc",
            [task_ids[LOCKED_TASKS : LOCKED_TASKS + LOCKED_COUPONS]],
        )


def _pending() -> int:
    return ExpiryTask.objects.filter(status="pending").count()


def _start_sweeper(stack):
    config = expiry_services.expiry_settings_get(max_age_s=0)
    config.batch_size, config.interval = BATCH, timedelta(seconds=1)
    expiry_services.expiry_settings_save(instance=config)
    return stack._start("sweeper", [sys.executable, "manage.py", "run_expiry_sweeper"])


def _assert_all_expired_once(task_ids: list[int]) -> None:
    assert ExpiryTask.objects.filter(pk__in=task_ids, status="processed").count() == DUE
    assert UserCoupon.objects.filter(status="expired").count() == DUE
    assert not UserCoupon.objects.exclude(status="expired").exists()


def test_sweep_works_around_a_long_open_transaction_then_expires_its_rows(stack):
    task_ids = _due_claims()
    holder = _holder()
    try:
        _lock(holder, task_ids)
        sweeper = _start_sweeper(stack)
        held = LOCKED_TASKS + LOCKED_COUPONS
        wait_for(lambda: _pending() == held, timeout=60,
                 what=f"the unlocked rows swept\n{sweeper.output()[-3000:]}")  # fmt: skip
        # Still held, still pending, coupons untouched; the sweeper keeps passing over them.
        seen = {selectors.last_run().get("finished_at")}
        wait_for(lambda: seen.add(selectors.last_run().get("finished_at")) or len(seen) >= 3,
                 timeout=30, what="two more passes")  # fmt: skip
        assert _pending() == held
        assert UserCoupon.objects.filter(status="unused").count() == held
        assert sweeper.alive()
    finally:
        holder.rollback()
        holder.close()
    wait_for(lambda: _pending() == 0, timeout=60,
             what=f"the released rows swept\n{sweeper.output()[-3000:]}")  # fmt: skip
    _assert_all_expired_once(task_ids)


def test_idle_in_transaction_session_timeout_ends_a_forgotten_transaction(stack):
    """The holder went idle in its transaction and never came back (a crashed or hung client);
    PostgreSQL ends the session after the timeout and the sweeper takes the rows."""
    task_ids = _due_claims()
    holder = _holder(options="-c idle_in_transaction_session_timeout=3000")
    try:
        _lock(holder, task_ids)
        sweeper = _start_sweeper(stack)
        wait_for(lambda: _pending() == 0, timeout=60,
                 what=f"every row swept\n{sweeper.output()[-3000:]}")  # fmt: skip
        _assert_all_expired_once(task_ids)
        with pytest.raises(psycopg2.OperationalError), holder.cursor() as cur:
            cur.execute("SELECT 1")  # PostgreSQL terminated the idle transaction's session
    finally:
        holder.close()
