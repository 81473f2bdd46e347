"""The reminder worker's upkeep yields to the urgent paths (docs/operations.md, Resource-aware
dispatch): the retention does not take its turn, or stops after its batch, and the claim gates'
upkeep skips its turn, while the reminders are behind; each goes on once they are on target.
Real PostgreSQL and Redis; the overdue reminder that puts the path behind is in the engine's
queue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from couponcenter.core.holdback import HELD, RUNNING, holdback_rows
from couponcenter.core.retention import RetentionTurn, retention_last_runs
from couponcenter.coupons import gate, services
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from reminders.models import TimeoutJob
from reminders.runtime.worker import GATES_JOB, RETENTION_JOB, GateUpkeep, RetentionUpkeep
from reminders.services.retention import TIMEOUT_JOBS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _signal(settings):
    settings.URGENCY_CACHE_MS = 0
    settings.URGENT_REMINDERS_TARGET_MS = 1000


def behind() -> None:
    now = epoch_ms()
    queue.schedule(REMINDER_TOPIC, "late", now - 30_000, slot=0, now_ms=now)


def on_target() -> None:
    queue.cancel(REMINDER_TOPIC, "late", slot=0)


def state(job: str) -> str:
    return {r.job: r.state for r in holdback_rows()}[job]


def finished_job(label: str) -> TimeoutJob:
    age = timedelta(days=8)  # past the default retention of 7 days
    row = TimeoutJob.objects.create(
        topic="timeout.default", biz_type="order", biz_id=label, status=TimeoutJob.Status.PROCESSED,
        action_time=timezone.now() - age,
    )  # fmt: skip
    TimeoutJob.objects.filter(pk=row.pk).update(gmt_modified=timezone.now() - age)
    return row


def test_the_retention_gives_its_turn_back_while_behind_and_runs_once_on_target(
    reminder_settings, redis_client
):
    finished_job("a")
    upkeep = RetentionUpkeep()
    behind()
    assert upkeep() is None
    assert TimeoutJob.objects.count() == 1 and state(RETENTION_JOB) == HELD
    # The turn was given back: nothing stands between the next check and the pass.
    assert not redis_client.exists(RetentionTurn("reminders", every_s=1).turn_key)
    on_target()
    upkeep()
    assert not TimeoutJob.objects.exists() and state(RETENTION_JOB) == RUNNING


def test_a_retention_pass_stops_after_its_batch_when_the_reminders_fall_behind(
    reminder_settings, settings
):
    # On PostgreSQL the table is partitioned and these rows, from a day with no partition, sit in
    # DEFAULT: the retention's drop deletes them in batches there. Elsewhere, batches of the table.
    settings.RETENTION_BATCH_SIZE = 1
    for label in "abc":
        finished_job(label)

    def first_delete_puts_reminders_behind(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("DELETE") and "timeoutjob" in sql.lower():
            behind()
        return result

    with connection.execute_wrapper(first_delete_puts_reminders_behind):
        RetentionUpkeep()()
    assert TimeoutJob.objects.count() == 2  # the batch in flight finished, the next waited
    last = retention_last_runs([TIMEOUT_JOBS])[TIMEOUT_JOBS]
    assert (last["removed"], last["stopped"]) == ("1", "1")


def test_the_gates_upkeep_skips_its_turn_while_behind(reminder_settings, redis_client, settings):
    settings.GATE_MAINTAIN_INTERVAL_S = 3600
    coupon = services.coupon_create(
        name="Rush", claim_opens_at=timezone.now() - timedelta(minutes=1), total_stock=10,
        valid_for=timedelta(days=7),
    )  # fmt: skip
    assert redis_client.delete(*gate._keys(coupon.pk))  # built on commit: Redis lost it
    upkeep = GateUpkeep()
    behind()
    assert upkeep() is None
    assert not redis_client.exists(gate._keys(coupon.pk)[0]) and state(GATES_JOB) == HELD
    on_target()
    redis_client.delete(f"{settings.REDIS_KEY_PREFIX}:gate:maintain")  # the next turn
    upkeep()
    assert redis_client.exists(gate._keys(coupon.pk)[0]) and state(GATES_JOB) == RUNNING
