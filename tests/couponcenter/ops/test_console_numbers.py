"""Numbers an operator can trust (issue 29, section 3), page by page, without a browser: times
to the second with their zone, lateness past the last bucket, counts that mean what they say.
The browser check of the same pages is tests/e2e/test_console_trust_browser.py."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import formats, timezone

from couponcenter.ops import charts
from reminders import metrics
from reminders.engine import leases, rates
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.runtime.worker import BacklogSampler, build_worker
from reminders.services import timeout_job_cancel, timeout_job_create, timeout_topic_save
from tests.support.console import kill_reminders, kill_timeout_jobs, member, overdue_reminders
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db

SECONDS_AND_ZONE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def job(reminder_settings) -> TimeoutJob:
    at = datetime(2031, 3, 4, 12, 37, 45, tzinfo=UTC)
    return timeout_job_create(
        topic="timeout.default", biz_type="order", biz_id="T-1", action_time=at
    )


def topic_row(page: str, topic: str) -> str:
    """The console's timeout-topics table row of ``topic``."""
    table = re.search(r'id="cc-timeout-topics".*?</table>', page, re.S).group(0)
    return re.search(rf'<tr data-topic="{re.escape(topic)}">.*?</tr>', table, re.S).group(0)


# --- times ---------------------------------------------------------------------------------------


def test_lists_and_detail_pages_show_seconds_and_the_zone(staff, job):
    listing = staff.get("/admin/reminders/timeoutjob/").content.decode()
    assert "2031-03-04 12:37:45 UTC" in listing
    assert "p.m." not in listing
    detail = staff.get(f"/admin/reminders/timeoutjob/{job.pk}/change/").content.decode()
    # The creation time, read-only on the page, to the second and named.
    assert SECONDS_AND_ZONE.search(detail)
    assert "p.m." not in detail and "a.m." not in detail


def test_a_date_renders_with_seconds_in_the_operators_zone_with_its_name(staff, job):
    with timezone.override("Europe/Paris"):
        shown = formats.localize(timezone.template_localtime(job.action_time))
    assert shown == "2031-03-04 13:37:45 CET"


# --- lateness ------------------------------------------------------------------------------------


def test_lateness_past_the_last_bucket_reads_more_than_ten_minutes(staff, reminder_settings):
    three_days_ms = 3 * 86_400_000
    metrics.record(REMINDER_TOPIC, {"delivered": 3}, [three_days_ms] * 3)
    metrics.record("timeout.default", {"delivered": 3}, [three_days_ms] * 3)
    page = staff.get("/admin/console/").content.decode()
    card = re.search(r'id="cc-p99".*?</div>\s*</div>', page, re.S).group(0)
    assert "&gt; 10 min" in card and "10 min 0 s" not in card
    assert "past the histogram's last bucket" in card
    row = topic_row(page, "timeout.default")
    assert "&gt; 10 min / &gt; 10 min" in row
    assert "p99 delivery lateness is &gt; 10 min" in page  # the warning banner


def test_lateness_inside_the_buckets_still_reads_as_a_duration(staff, reminder_settings):
    metrics.record(REMINDER_TOPIC, {"delivered": 100}, [400_000] * 100)  # 5-10 min bucket
    card = re.search(
        r'id="cc-p99".*?</div>\s*</div>', staff.get("/admin/console/").content.decode(), re.S
    ).group(0)
    assert re.search(r">\d+ min \d+ s<", card) and "&gt;" not in card


# --- rate limit ----------------------------------------------------------------------------------


def test_the_rate_limit_cell_shows_jobs_held_back_and_tokens_as_of_now(staff, reminder_settings):
    timeout_topic_save(topic=TimeoutTopic(name="t.limit"), type="log", rate_limit_per_s=100)
    # Emptied a minute ago: refilled to the burst (10) since; the 40 refused tokens held no job.
    assert rates.take("t.limit", 100, 50, now_ms=epoch_ms() - 60_000) == 10
    assert rates.take("t.limit", 100, 40, now_ms=epoch_ms() - 60_000) == 0
    row = topic_row(staff.get("/admin/console/").content.decode(), "t.limit")
    assert ">10 tokens<" in row
    assert ">0 jobs held back<" in row
    rates.held_back("t.limit", 3)
    row = topic_row(staff.get("/admin/console/").content.decode(), "t.limit")
    assert ">3 jobs held back<" in row


# --- counts --------------------------------------------------------------------------------------


def test_executors_show_threads_apart_from_what_they_take_in(staff, reminder_settings):
    timeout_topic_save(topic=TimeoutTopic(name="t.exec"), type="log", concurrency=8)
    for n, (in_flight, capacity) in enumerate([(3, 8000), (0, 8000)]):
        leases.heartbeat(
            leases.WorkerInfo(
                worker_id=f"w{n}",
                heartbeat_ms=epoch_ms(),
                load={"t.exec": [in_flight, capacity, 8]},
            )
        )
    row = topic_row(staff.get("/admin/console/").content.decode(), "t.exec")
    assert re.search(r'class="cc-threads">16 in 2 workers<', row)
    assert re.search(r'class="cc-taken-in[^"]*"[^>]*>3 / 16000 \(0%\)<', row)


def test_a_timeout_topic_counts_what_it_dispatched(
    staff, reminder_settings, django_capture_on_commit_callbacks
):
    timeout_topic_save(topic=TimeoutTopic(name="t.count"), type="log")
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(3):
            timeout_job_create(
                topic="t.count",
                biz_type="order",
                biz_id=f"C-{i}",
                action_time=timezone.now() - timedelta(seconds=1),
            )
    worker = build_worker(["t.count"])
    try:
        worker.run_until_idle()
    finally:
        worker.shutdown()
    assert metrics.totals("t.count")["dispatched"] == 3
    page = staff.get("/admin/console/").content.decode()
    assert re.search(
        r"<h3>t\.count <small>\([^)]*: 3 dispatched, 3 delivered, 0 failed, 0 dead", page
    )


def _drawn(svg: str) -> list[str]:
    """The chart's lines in drawing order (the last drawn is on top)."""
    return list(dict.fromkeys(re.findall(r'<(?:polyline|circle)[^>]*data-line="(\w+)"', svg)))


def test_the_count_chart_has_dead_and_lines_at_zero_hide_nothing():
    rows = [
        {"minute": 60 * m, "dispatched": 5, "delivered": 3, "failed": 0, "dead": 2, "dropped": 0}
        for m in range(4)
    ]
    svg = charts.line_chart(rows, charts.COUNT_LINES, title="t", under_first=True)
    assert 'data-key="dead"' in svg and 'data-line="dead"' in svg
    order = _drawn(svg)
    # failed and dropped stay at zero: drawn first, beneath the lines with counts.
    assert set(order[:2]) == {"failed", "dropped"}
    assert order[2:] == ["dispatched", "delivered", "dead"]
    # the two at zero take turns along the axis: each shows its colour
    dashes = re.findall(r'stroke-dasharray="6 6" stroke-dashoffset="(-?\d+)"', svg)
    assert sorted(dashes) == ["-6", "0"]
    # the legend keeps its order
    assert re.findall(r'data-key="(\w+)"', svg) == [k for k, _, _ in charts.COUNT_LINES]


# --- topics list ---------------------------------------------------------------------------------


def test_the_topics_list_shows_built_in_topics_backlog_and_a_plain_state(
    staff, reminder_settings, django_capture_on_commit_callbacks
):
    timeout_topic_save(topic=TimeoutTopic(name="t.listed"), type="log", slots=1)
    timeout_topic_save(topic=TimeoutTopic(name="t.paused"), type="log", paused=True)
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(4):
            timeout_job_create(
                topic="t.listed",
                biz_type="order",
                biz_id=f"L-{i}",
                action_time=timezone.now() + timedelta(seconds=-1 if i < 3 else 3600),
            )
        timeout_job_create(
            topic="order.close", biz_type="order", biz_id="B-1", action_time=timezone.now()
        )
    page = staff.get("/admin/reminders/timeouttopic/").content.decode()
    row = re.search(r"<tr>(?:(?!</tr>).)*?t\.listed(?:(?!</tr>).)*</tr>", page, re.S).group(0)
    assert ">4 / 3 / 0 / 0<" in row  # scheduled / due / in flight / dead
    assert "running" in row and "icon-no" not in row
    paused = re.search(r"<tr>(?:(?!</tr>).)*?t\.paused(?:(?!</tr>).)*</tr>", page, re.S).group(0)
    assert "PAUSED" in paused
    builtin = re.search(r'id="builtin-topics".*?</table>', page, re.S).group(0)
    for name in ("order.close", "timeout.default"):
        assert f'data-topic="{name}"' in builtin
    order_close = re.search(r'data-topic="order.close">.*?</tr>', builtin, re.S).group(0)
    assert 'class="cc-backlog">1 / 1 / 0 / 0<' in order_close


# --- dead letters --------------------------------------------------------------------------------


def dead_row(page: str, key: str) -> str:
    """The dead-letter list's row of ``topic|slot|job id``."""
    rows = re.findall(r"<tr data-job=.*?</tr>", page, re.S)
    return next(row for row in rows if f'value="{key}"' in row)


def test_dead_letters_show_the_business_key_and_link_the_row(
    staff, reminder_settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        job = timeout_job_create(
            topic="timeout.default", biz_type="order", biz_id="D-9", action_time=timezone.now()
        )
        subs = overdue_reminders([7001])
    kill_timeout_jobs([job])
    kill_reminders(subs)
    page = staff.get("/admin/reminders/deadletter/").content.decode()
    job_row = dead_row(page, f"timeout.default|{job.slot}|{job.pk}")
    assert '<td class="dl-key">order:D-9</td>' in job_row
    assert f'href="/admin/reminders/timeoutjob/{job.pk}/change/"' in job_row
    sub = subs[0]
    sub_row = dead_row(page, f"{REMINDER_TOPIC}|{sub.slot}|{member(sub)}")
    assert f'<td class="dl-key">coupon {sub.coupon_id}, user 7001</td>' in sub_row
    assert f'href="/admin/reminders/remindersubscription/{sub.pk}/change/"' in sub_row
    api = staff.get("/api/ops/dead-letters/", {"topic": "timeout.default"}).json()
    assert [r["business_key"] for r in api["results"]] == ["order:D-9"]


def test_times_written_by_the_console_templates_carry_the_zone(
    staff, reminder_settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        subs = overdue_reminders([7101])
    kill_reminders(subs)
    dead = staff.get("/admin/reminders/deadletter/").content.decode()
    assert SECONDS_AND_ZONE.search(
        dead_row(dead, f"{REMINDER_TOPIC}|{subs[0].slot}|{member(subs[0])}")
    )
    console = staff.get("/admin/console/").content.decode()
    assert re.search(r'id="cc-updated">\d\d:\d\d:\d\d UTC<', console)


# --- the queue page ------------------------------------------------------------------------------


@pytest.fixture
def queued(reminder_settings, django_capture_on_commit_callbacks):
    """t.queue: 3 overdue jobs, 2 due later, one of them cancelled; one dead."""
    timeout_topic_save(topic=TimeoutTopic(name="t.queue"), type="log", slots=2)
    at = [-5, -5, -5, 600, 600, -5]
    with django_capture_on_commit_callbacks(execute=True):
        jobs = [
            timeout_job_create(
                topic="t.queue",
                biz_type="order",
                biz_id=f"Q-{i}",
                action_time=timezone.now() + timedelta(seconds=s),
            )
            for i, s in enumerate(at)
        ]
        timeout_job_cancel(job=jobs[4])
    kill_timeout_jobs([jobs[5]])
    return jobs


def test_the_backlog_sampler_feeds_the_backlog_over_time(queued):
    BacklogSampler(every_s=0)()
    row = metrics.series("t.queue", minutes=1)[-1]
    assert (row["backlog"], row["overdue"]) == (4, 3)  # the cancelled one left, the dead one too
    assert metrics.series("t.nothing", minutes=1)[-1]["backlog"] is None  # no sample: a gap


def test_the_queue_page_shows_the_backlog_now_and_over_time(staff, queued):
    now = time.time()
    for minutes_ago, n in ((3, 9), (2, 7), (1, 5)):
        metrics.sample_backlog("t.queue", backlog=n, overdue=n - 2, now=now - 60 * minutes_ago)
    page = staff.get("/admin/console/queue/t.queue/")
    assert page.status_code == 200
    html = page.content.decode()
    assert re.search(r'id="q-store">4<', html) and re.search(r'id="q-due">3<', html)
    assert re.search(r'id="q-dead">1<', html)
    chart = re.search(r"<svg[^>]*aria-label=\"t.queue: backlog[^\"]*\".*?</svg>", html, re.S)
    assert chart and 'data-line="backlog"' in chart.group(0)
    assert 'data-line="overdue"' in chart.group(0)
    assert staff.get("/admin/console/queue/no.such/").status_code == 404
    console = staff.get("/admin/console/").content.decode()
    assert 'href="/admin/console/queue/t.queue/"' in console


def test_the_queue_page_filters_its_jobs(staff, queued):
    def listed(**query) -> list[str]:
        html = staff.get("/admin/console/queue/t.queue/", query).content.decode()
        return re.findall(r'<tr data-job="(\d+)">', html)

    ids = [str(j.pk) for j in queued]
    assert listed() == ids[::-1]  # newest first
    assert listed(status="pending") == ids[3::-1]
    assert listed(status="cancelled") == [ids[4]]
    assert listed(status="dead") == [ids[5]]
    assert listed(q="order:Q-2") == [ids[2]]
    assert listed(q=ids[1]) == [ids[1]]


def test_the_queue_pages_bulk_action_acts_on_its_topic_only(staff, queued):
    timeout_job_create(
        topic="timeout.default", biz_type="order", biz_id="other", action_time=timezone.now()
    )
    html = staff.get("/admin/console/queue/t.queue/", {"status": "pending"}).content.decode()
    action = re.search(r'<form method="post" action="([^"]+)" id="q-jobs-form">', html).group(1)
    action = action.replace("&amp;", "&")
    form = {"action": "cancel_jobs", "select_across": "1", "index": "0", "_selected_action": []}
    confirm = staff.post(action, {**form, "_selected_action": [str(queued[0].pk)]})
    assert 'id="tj-confirm-count">4<' in confirm.content.decode()  # every pending job of t.queue
    staff.post(action, {**form, "_selected_action": [str(queued[0].pk)], "post": "yes"})
    left = TimeoutJob.objects.filter(status=TimeoutJob.Status.PENDING)
    assert list(left.values_list("biz_id", flat=True)) == ["other"]
