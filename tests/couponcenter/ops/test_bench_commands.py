"""The benchmark commands: bad input is refused before anything runs, and the small real runs
measure what they say (real Redis, real database); speed itself is never asserted."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from couponcenter.core.redis import get_redis
from reminders.bench.raw_inbox import bench_raw_inbox
from reminders.models import Notification, ReminderSubscription


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
        ("bench_reminders", ["--prestage-ms", "-1"], "--prestage-ms must be"),
        ("bench_timeouts", ["--count", "5"], "--count must be within"),
        ("bench_timeouts", ["--concurrency", "0"], "--concurrency must be within"),
        ("bench_timeouts", ["--bulk-jobs", "10000", "--cancels", "20000"], "must not exceed"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(command, args, message):
    before = get_redis().dbsize()
    with pytest.raises(CommandError, match=message):
        call_command(command, *args)
    assert get_redis().dbsize() == before


def test_a_report_of_files_that_are_not_runs_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(CommandError, match="not a bench_all JSON file"):
        call_command("bench_all", "--report", str(bad))


def test_the_backlog_bench_measures_memory_and_claims_every_due_job():
    before = get_redis().dbsize()
    out = StringIO()
    call_command("bench_backlog", "--sizes", "1000,4000", "--sample", "1000", "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert [row["pending"] for row in result["sizes"]] == [1000, 4000]
    # A pending reminder costs memory: a sorted-set entry with its member, never nothing.
    assert all(row["bytes_per_pending"] > 20 for row in result["sizes"])
    assert all(row["claim_ack_per_s"] > 0 for row in result["sizes"])
    assert get_redis().dbsize() == before  # everything it made is gone


@pytest.mark.django_db(transaction=True)
def test_the_raw_inbox_loop_writes_every_row_and_cleans_up(reminder_settings):
    result = bench_raw_inbox(600, 8_800_000_000, batch_size=100)
    assert result["raw_inbox_per_s"] > 0 and result["raw_inbox_processes"] == 2
    assert result["raw_inbox_written"] == 600
    assert not Notification.objects.filter(user_id__gte=8_800_000_000).exists()
    assert not ReminderSubscription.objects.filter(user_id__gte=8_800_000_000).exists()
