"""The reminder worker's retention chore (runtime.worker.RetentionUpkeep): one pass per turn
across the fleet, inline or in its own thread, stopped by ``close``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.core.retention import RetentionTurn, retention_last_runs
from reminders.models import TimeoutJob
from reminders.runtime.worker import RetentionUpkeep
from reminders.services.retention import TIMEOUT_JOBS

pytestmark = pytest.mark.django_db(transaction=True)


def finished_job(label: str, *, age: timedelta) -> TimeoutJob:
    row = TimeoutJob.objects.create(
        topic="timeout.default", biz_type="order", biz_id=label, status=TimeoutJob.Status.PROCESSED,
        action_time=timezone.now() - age,
    )  # fmt: skip
    TimeoutJob.objects.filter(pk=row.pk).update(gmt_modified=timezone.now() - age)
    return row


def test_one_pass_per_turn_inline(reminder_settings, redis_client):
    old = finished_job("a", age=timedelta(days=8))  # default retention: 7 days
    kept = finished_job("b", age=timedelta(days=6))
    upkeep = RetentionUpkeep()
    upkeep()
    assert list(TimeoutJob.objects.values_list("pk", flat=True)) == [kept.pk]
    assert retention_last_runs([TIMEOUT_JOBS])[TIMEOUT_JOBS]["removed"] == "1"

    later = finished_job("c", age=timedelta(days=8))
    RetentionUpkeep()()  # another worker within the interval: not its turn
    assert TimeoutJob.objects.filter(pk=later.pk).exists()
    redis_client.delete(RetentionTurn("reminders", every_s=1).turn_key)
    upkeep()
    assert not TimeoutJob.objects.filter(pk=later.pk).exists()
    assert not TimeoutJob.objects.filter(pk=old.pk).exists()


def test_in_the_background_and_closed(reminder_settings, redis_client):
    old = finished_job("a", age=timedelta(days=8))
    upkeep = RetentionUpkeep(background=True)
    future = upkeep()
    assert future is not None
    runs = future.result(timeout=30)
    assert {r.name for r in runs} >= {TIMEOUT_JOBS, "dead_letters"}
    assert not TimeoutJob.objects.filter(pk=old.pk).exists()
    assert not redis_client.exists(RetentionTurn("reminders", every_s=1).lease_key)
    upkeep.close()
    redis_client.delete(RetentionTurn("reminders", every_s=1).turn_key)
    assert upkeep() is None  # closed: no new pass
