"""The benchmark commands: bad input is refused before anything runs, and the small real runs
measure what they say (real Redis, real database); speed itself is never asserted."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from couponcenter.core.redis import get_redis
from couponcenter.coupons.models import Coupon
from couponcenter.ops.bench.console import DEAD_SLOTS, ConsoleBench
from reminders import engine
from reminders.bench import timeouts as bench_timeouts
from reminders.bench.backlog import bench_rebuild_size
from reminders.bench.raw_inbox import bench_raw_inbox
from reminders.members import REMINDER_TOPIC
from reminders.models import Notification, ReminderSubscription, TimeoutJob, TimeoutTopic
from reminders.selectors import reminder_settings_get
from reminders.services import timeout_job_create, timeout_topic_save
from tests.support.factories import CouponFactory


class RedisKeys:
    """The keys in the test's Redis database now, to say afterwards that a command left none of
    its own and took none of anyone else's. A key other tests left with a time to live may expire
    meanwhile, so the keys are compared, not their count. It reads the whole database, so a test
    that uses it is ``alone``: a test running beside it deletes its own keys as it ends."""

    def __init__(self) -> None:
        self.client = get_redis()
        self.before = set(self.client.scan_iter(count=1000))
        self.lasting = {k for k in self.before if self.client.ttl(k) == -1}
        self.own_test = f"{settings.REDIS_KEY_PREFIX}:"

    def assert_as_before(self) -> None:
        after = set(self.client.scan_iter(count=1000))
        # A key under another test's prefix is not the command's: on a loaded machine a process
        # an earlier test stopped may still write one as it goes.
        new = {k for k in after - self.before if not self._another_tests(k)}
        assert new == set()  # nothing of its own left behind
        assert self.lasting <= after  # nothing lasting of anyone else's removed

    def _another_tests(self, key: bytes | str) -> bool:
        name = key.decode() if isinstance(key, bytes) else key
        return name.startswith("cctest-") and not name.startswith(self.own_test)


@pytest.mark.alone
@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("bench_peers", ["--rates", "fast"], "--rates must be whole numbers"),
        ("bench_peers", ["--peers", "sidekiq"], "--peers takes"),
        ("bench_peers", ["--count", "0"], "--count must be"),
        ("bench_backlog", ["--sizes", "10"], "each size must be"),
        ("bench_backlog", ["--sizes", "1e6"], "--sizes must be whole numbers"),
        ("bench_all", ["--only", "everything"], "--only takes"),
        ("bench_all", ["--count", "5"], "--count must be"),
        ("bench_all", ["--rush-users", "10"], "--rush-users must be"),
        ("bench_rush", ["--stocks", "many"], "--stocks takes numbers"),
        ("bench_rush", ["--stocks", "0"], "--stocks takes one or more"),
        ("bench_rush", ["--connections", "0"], "--connections must be within"),
        ("bench_reminders", ["--prestage-ms", "-1"], "--prestage-ms must be"),
        ("bench_reminders", ["--backlog", "-1"], "--backlog must be between"),
        ("bench_reminders", ["--backlog", "60000000"], "--backlog must be between"),
        ("bench_timeouts", ["--count", "5"], "--count must be within"),
        ("bench_fanout", ["--count", "5"], "--count must be within"),
        ("bench_fanout", ["--concurrency", "0"], "--concurrency must be within"),
        ("bench_fanout", ["--wrk-seconds", "0"], "--wrk-seconds must be within"),
        ("bench_timeouts", ["--concurrency", "0"], "--concurrency must be within"),
        ("bench_timeouts", ["--bulk-jobs", "10000", "--cancels", "20000"], "must not exceed"),
        ("bench_days", ["--days", "5", "--retention-days", "2"], "at least 3 x --retention-days"),
        ("bench_days", ["--retention-days", "0"], "--retention-days must be within"),
        ("bench_days", ["--claims", "1"], "--claims must be within"),
        ("bench_days", ["--timeouts", "-5"], "--timeouts must be within"),
        ("bench_days", ["--autovacuum-wait", "601"], "--autovacuum-wait must be within"),
        ("bench_day", ["--minutes", "0"], "--minutes must be within"),
        ("bench_day", ["--burst", "1"], "--burst must be within"),
        ("bench_day", ["--expiry", "-1"], "--expiry must be within"),
        ("bench_day", ["--claims-rate", "0"], "--claims-rate must be within"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(command, args, message):
    keys = RedisKeys()
    with pytest.raises(CommandError, match=message):
        call_command(command, *args)
    keys.assert_as_before()


def test_a_report_of_files_that_are_not_runs_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(CommandError, match="not a bench_all JSON file"):
        call_command("bench_all", "--report", str(bad))


@pytest.mark.alone
def test_the_backlog_bench_measures_memory_and_claims_every_due_job():
    keys = RedisKeys()
    out = StringIO()
    # Backlogs past the sorted sets' compact encoding (128 entries a key; 16 slots), as a
    # production backlog is, and large enough that Redis's own housekeeping in the same moment
    # is small beside them: ``used_memory`` is the server's, and after the rest of the suite a
    # keyspace table shrunk meanwhile frees tens of KB (1,000 jobs, compactly encoded at about
    # 20 bytes each, once read exactly 20.0 a job).
    sizes = [8000, 16000]
    call_command(
        "bench_backlog", "--sizes", ",".join(map(str, sizes)), "--sample", "1000", "--json",
        stdout=out,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    assert [row["pending"] for row in result["sizes"]] == sizes
    # A pending reminder costs memory: a sorted-set entry with its member, never nothing.
    assert all(row["bytes_per_pending"] > 20 for row in result["sizes"])
    assert all(row["claim_ack_per_s"] > 0 for row in result["sizes"])
    keys.assert_as_before()  # everything it made is gone


@pytest.mark.alone
@pytest.mark.django_db(transaction=True)
def test_the_rebuild_bench_indexes_every_scheduled_reminder_elsewhere_and_cleans_up():
    keys = RedisKeys()
    out = StringIO()
    call_command(
        "bench_backlog", "--sizes", "1000,3000", "--sample", "1000", "--rebuild", "--json",
        stdout=out,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    # bench_rebuild_size raises unless the rebuild indexed exactly that many.
    assert [row["scheduled"] for row in result["rebuild"]] == [1000, 3000]
    assert all(row["rebuild_per_s"] > 0 for row in result["rebuild"])
    assert result["rebuild_rate_growth"] > 0
    keys.assert_as_before()  # its keys went to its own prefix and are gone
    assert not ReminderSubscription.objects.exists()
    assert not Coupon.objects.filter(name="__bench_rebuild__").exists()


@pytest.mark.django_db(transaction=True)
def test_the_rebuild_bench_refuses_a_database_with_scheduled_reminders():
    coupon = CouponFactory()
    ReminderSubscription.objects.create(coupon=coupon, user_id=1, remind_at=coupon.claim_opens_at)
    with pytest.raises(RuntimeError, match="no scheduled reminders"):
        bench_rebuild_size(1000)
    assert ReminderSubscription.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_raw_inbox_loop_writes_every_row_and_cleans_up(reminder_settings):
    result = bench_raw_inbox(600, 8_800_000_000, batch_size=100)
    assert result["raw_inbox_per_s"] > 0 and result["raw_inbox_processes"] == 2
    assert result["raw_inbox_written"] == 600
    assert not Notification.objects.filter(user_id__gte=8_800_000_000).exists()
    assert not ReminderSubscription.objects.filter(user_id__gte=8_800_000_000).exists()


@pytest.mark.django_db
def test_the_timeouts_bench_starts_by_removing_what_a_killed_run_left(
    django_capture_on_commit_callbacks,
):
    """A killed run leaves its rows; a new run's worker would index and fire them mid-run."""
    at = timezone.now() + timedelta(days=1)
    timeout_topic_save(topic=TimeoutTopic(name=bench_timeouts.BURST_TOPIC), type="log")
    with django_capture_on_commit_callbacks(execute=True):
        left = timeout_job_create(topic=bench_timeouts.BURST_TOPIC, action_time=at,
                                  biz_type="bench", biz_id="b-1")  # fmt: skip
        kept = timeout_job_create(topic="timeout.default", action_time=at, biz_type="order",
                                  biz_id="real")  # fmt: skip
    bench_timeouts._cleanup_rows()
    assert not TimeoutJob.objects.filter(pk=left.pk).exists()
    assert not TimeoutTopic.objects.filter(name=bench_timeouts.BURST_TOPIC).exists()
    assert TimeoutJob.objects.filter(pk=kept.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_console_bench_buries_through_the_engine_times_every_page_and_cleans_up():
    bench = ConsoleBench(count=300, repeat=1)
    try:
        bench.load()
        slots = reminder_settings_get(max_age_s=0).slots
        users = ReminderSubscription.objects.filter(coupon=bench.coupons[1]).values_list(
            "user_id", flat=True
        )
        # Every reminder of the first slots went dead (fewer than DEAD of them at this size).
        dying = sum(engine.slot_for(user_id, slots) < DEAD_SLOTS for user_id in users)
        dead = [engine.list_dead(REMINDER_TOPIC, slot, limit=1000) for slot in range(slots)]
        assert sum(map(len, dead)) == dying > 0
        pages = bench.pages()
        timings = bench.measure()
    finally:
        bench.cleanup()
    assert [t.page for t in timings] == pages
    assert {t.status for t in timings} <= {200, 302}, [(t.page, t.status) for t in timings]
    assert not list(get_redis().scan_iter(match=f"{bench.tag}:*"))
    assert not Coupon.objects.filter(name__startswith=bench.tag).exists()
    assert not ReminderSubscription.objects.exists()
