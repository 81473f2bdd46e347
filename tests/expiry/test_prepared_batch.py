"""The sweeper's batch as a server-side prepared statement (couponcenter.core.db.prepared), on a
real PostgreSQL: prepared once per connection and run on its generic plan; a statement the server
lost (a pooler's reset, ``DEALLOCATE``) or has already (a pooler's session) costs a rerun of the
batch, never a batch done twice or left undone; inside a caller's transaction, or turned off, the
batch runs as plain SQL."""

from __future__ import annotations

from datetime import timedelta

import psycopg2
import pytest
from django.db import connection, transaction
from django.utils import timezone

from couponcenter.core.db import prepared
from couponcenter.coupons.models import UserCoupon
from expiry import services, sql
from expiry.models import ExpiryTask
from tests.support.factories import ExpiryTaskFactory, UserCouponFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def on_server() -> dict[str, tuple[int, int]]:
    """This session's prepared expiry batches: (generic, custom) plans used."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE starts_with(name, 'cc_expiry_')"
        )
        return {name: (generic, custom) for name, generic, custom in cursor.fetchall()}


def due_tasks(n: int) -> list[ExpiryTask]:
    now = timezone.now()
    return [
        ExpiryTaskFactory(user_coupon=UserCouponFactory(
            expires_at=now - timedelta(minutes=n - i), claimed_at=now - timedelta(days=1)
        ))
        for i in range(n)
    ]  # fmt: skip


def swept(tasks: list[ExpiryTask]) -> list[tuple[str, str]]:
    rows = ExpiryTask.objects.filter(pk__in=[t.pk for t in tasks])
    return sorted(set(rows.values_list("status", "user_coupon__status")))


def sweep(batch_size: int, after=None) -> services.SweepResult:
    return services.expiry_sweep_batch(now=timezone.now(), batch_size=batch_size, after=after)


def test_batches_run_one_prepared_statement_on_its_generic_plan():
    tasks = due_tasks(6)
    after = None
    for _ in range(3):
        result = sweep(2, after)
        assert (result.processed, result.expired) == (2, 2)
        after = result.last
    # Up the due index: one statement, planned for no values in particular from its first run.
    assert list(on_server().values()) == [(3, 0)]
    assert swept(tasks) == [(ExpiryTask.Status.PROCESSED, UserCoupon.Status.EXPIRED)]


def test_a_batch_whose_statement_the_server_lost_runs_again_once():
    tasks = due_tasks(4)
    first = sweep(2)
    assert first.processed == 2
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # as a pooler's reset would; the connection still
    # believes it has the statement: its EXECUTE fails, the batch rolls back and runs again
    second = sweep(2, first.last)
    assert (second.processed, second.expired) == (2, 2)
    assert set(second.task_ids or ()) <= {t.pk for t in tasks}
    assert list(on_server().values()) == [(1, 0)]  # prepared again, for the rerun
    assert swept(tasks) == [(ExpiryTask.Status.PROCESSED, UserCoupon.Status.EXPIRED)]
    assert sweep(2, second.last).claimed == 0


def test_a_batch_whose_statement_the_session_has_already_runs_again_once():
    # Behind a pooler in session mode a new client may get a server session that has it.
    tasks = due_tasks(4)
    first = sweep(2)
    connection.prepared_statements.clear()
    second = sweep(2, first.last)  # its PREPARE fails, the batch rolls back and runs again
    assert (second.processed, second.expired) == (2, 2)
    assert list(on_server().values()) == [(2, 0)]  # the one statement, run twice
    assert swept(tasks) == [(ExpiryTask.Status.PROCESSED, UserCoupon.Status.EXPIRED)]


def test_a_first_batch_that_waited_on_a_row_lock_keeps_its_statement_for_the_next(monkeypatch):
    """The PREPARE and the EXECUTE go in one round trip; when the EXECUTE fails after the PREPARE
    (a row lock held too long sends the batch the careful way), the statement stays on the
    server, and the connection knows it: the next batch does not PREPARE it again."""
    monkeypatch.setattr(services, "FAST_LOCK_WAIT_MS", 50)
    tasks = due_tasks(4)
    db = connection.settings_dict
    holder = psycopg2.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"] or 5432
    )
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT 1 FROM couponcenter_usercoupon WHERE id = %s FOR UPDATE",
                           [tasks[0].user_coupon_id])  # fmt: skip
        held = sweep(2)
    finally:
        holder.rollback()
        holder.close()
    assert held.careful and held.processed == 2  # past the held coupon
    key = sql.FAST[False].key
    assert key in connection.prepared_statements and key in on_server()
    runs = []
    run = prepared.execute_in_own_transaction
    monkeypatch.setattr(
        prepared, "execute_in_own_transaction", lambda *a, **k: runs.append(1) or run(*a, **k)
    )

    after = sweep(4)
    assert (after.careful, after.processed) == (False, 2)
    assert len(runs) == 1  # in one go: no PREPARE refused as a duplicate, no rerun
    assert swept(tasks) == [(ExpiryTask.Status.PROCESSED, UserCoupon.Status.EXPIRED)]


def test_inside_a_transaction_or_turned_off_the_batch_is_plain_sql(settings):
    tasks = due_tasks(4)
    with transaction.atomic():
        assert sweep(2).processed == 2
    settings.DB_PREPARED_STATEMENTS = False
    assert sweep(2).processed == 2
    assert on_server() == {}
    assert swept(tasks) == [(ExpiryTask.Status.PROCESSED, UserCoupon.Status.EXPIRED)]
