"""The Django layer unchanged on a real 3-master Redis Cluster (``REDIS_URL=redis+cluster://``):
the services index, the worker fires, a cancel finds its entry and a rebuild restores a flush."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from couponcenter.core.redis import get_redis, is_cluster
from couponcenter.core.retention import RetentionTurn
from reminders.engine import keys, queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from reminders.models import Notification, ReminderSubscription, TimeoutJob
from reminders.runtime.worker import RetentionUpkeep, build_worker
from reminders.services import subscription_subscribe, timeout_job_cancel
from tests.conftest import delete_keys
from tests.reminders import test_timeouts_handlers as handlers
from tests.reminders.engine import conftest as engine_conftest
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.django_db, pytest.mark.cluster]

# The engine's session-wide 3-master cluster, and the timeout-job fixtures of the handler tests.
redis_cluster, cluster_client = engine_conftest.redis_cluster, engine_conftest.cluster_client
topics, make_job, calls = handlers.topics, handlers.make_job, handlers.calls

TOPIC, SLOTS = "t.call", 8
ACTION = "tests.reminders.test_timeouts_handlers.record_call"


@pytest.fixture
def on_cluster(cluster_client, settings):
    """Point ``get_redis()`` at the cluster (clients are cached per URL, so this is a new one)."""
    node = cluster_client.get_primaries()[0]
    settings.REDIS_URL = f"redis+cluster://{node.host}:{node.port}"
    assert is_cluster(get_redis())
    return cluster_client


def drain(*topic_names: str):
    worker = build_worker(list(topic_names))
    try:
        return worker.run_until_idle()
    finally:
        worker.shutdown()


def backlog(topic: str, slots: int) -> int:
    return sum(s.store + s.prepare + s.dead for s in queue.stats(topic, range(slots), now_ms=0))


def test_jobs_index_fire_cancel_and_rebuild_on_a_cluster(
    on_cluster, topics, make_job, calls, redis_prefix, django_capture_on_commit_callbacks
):
    topics(t_call={"type": "callable", "path": ACTION, "slots": SLOTS})
    jobs = [make_job(TOPIC, biz_id=f"C-{n}") for n in range(24)]
    assert backlog(TOPIC, SLOTS) == 24
    nodes = {
        on_cluster.get_node_from_key(keys.slot_keys(TOPIC, job.slot).store).name for job in jobs
    }
    assert len(nodes) > 1  # the slots really live on different masters

    cancelled = jobs.pop()
    with django_capture_on_commit_callbacks(execute=True):
        timeout_job_cancel(job=cancelled)
    assert backlog(TOPIC, SLOTS) == 23

    delete_keys(on_cluster, f"{redis_prefix}:*")  # a flush of this test's keys
    assert backlog(TOPIC, SLOTS) == 0
    call_command("rebuild_reminder_queues", stdout=StringIO(), stderr=StringIO())
    assert backlog(TOPIC, SLOTS) == 23

    report = drain(TOPIC)
    assert (report.claimed, report.acked) == (23, 23)
    assert sorted(calls) == sorted(j.pk for j in jobs)
    assert TimeoutJob.objects.filter(status=TimeoutJob.Status.PROCESSED).count() == 23
    assert backlog(TOPIC, SLOTS) == 0


def test_reminders_deliver_on_a_cluster(
    on_cluster, reminder_settings, eager_celery, django_capture_on_commit_callbacks
):
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=30))
    with django_capture_on_commit_callbacks(execute=True):
        subs = [subscription_subscribe(user_id=u, coupon=coupon)[0] for u in range(3000, 3006)]
    assert backlog(REMINDER_TOPIC, 16) == 6
    assert drain(REMINDER_TOPIC).claimed == 6
    assert sorted(Notification.objects.values_list("user_id", flat=True)) == sorted(
        s.user_id for s in subs
    )
    assert set(ReminderSubscription.objects.values_list("status", flat=True)) == {"sent"}
    assert backlog(REMINDER_TOPIC, 16) == 0


def test_retention_takes_its_turn_and_purges_dead_letters_on_a_cluster(
    on_cluster, reminder_settings, redis_prefix
):
    k = keys.slot_keys(REMINDER_TOPIC, 3)
    old_ms = epoch_ms(timezone.now() - timedelta(days=40))  # default retention: 30 days
    get_redis().zadd(k.dead, {"s:1": old_ms, "s:2": epoch_ms()})
    RetentionUpkeep()()
    assert get_redis().zrange(k.dead, 0, -1) == [b"s:2"]
    turn = RetentionTurn("reminders", every_s=60)
    assert not turn.take()  # the upkeep's turn holds for the interval, cluster-wide
    delete_keys(get_redis(), f"{redis_prefix}:*")
