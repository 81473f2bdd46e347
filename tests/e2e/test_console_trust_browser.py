"""Numbers an operator can trust, checked in Chromium (Playwright) for a known workload: every
console page is opened and saved as a screenshot (the ``screenshots`` directory; CI keeps it as
an artifact), and the figures each page shows are asserted against what the workload put there.

The workload, built without a running worker so that every figure is known:
- ``t.trust`` (a ``log`` topic, 100 jobs/s, 8 threads): 3 overdue jobs, 2 due in an hour, one
  dead (``order:T-dead``) and one that succeeded after a requeue (``order:T-done``, last error
  kept); a worker's heartbeat with 2 of 8000 taken in over 8 threads; its lateness all three
  days late; its backlog sampled over the last minutes; its rate-limit bucket emptied a minute
  ago, with 40 tokens refused and no job held back;
- a coupon with 3 claims, one redeemed.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.coupons import services as coupon_services
from couponcenter.coupons.models import UserCoupon
from reminders import metrics
from reminders.engine import leases, queue, rates
from reminders.engine.clock import epoch_ms
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.services import timeout_job_create, timeout_topic_save
from tests.e2e.test_console_browser import ARGS, CHROMIUM, PASSWORD, shot
from tests.support.console import kill_timeout_jobs
from tests.support.factories import CouponFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOPIC = "t.trust"
SECONDS_AND_ZONE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
THREE_DAYS_MS = 3 * 86_400_000


@pytest.fixture
def workload(live_server, transactional_db, reminder_settings, settings):
    settings.WORKER_LEASE_MS = 60_000  # the stand-in worker below beats once: live all the test
    timeout_topic_save(
        topic=TimeoutTopic(name=TOPIC), type="log", slots=2, rate_limit_per_s=100, concurrency=8
    )
    now = timezone.now()

    def job(biz_id: str, in_s: int) -> TimeoutJob:
        return timeout_job_create(
            topic=TOPIC, biz_type="order", biz_id=biz_id, action_time=now + timedelta(seconds=in_s)
        )

    overdue = [job(f"T-{i}", -30) for i in range(3)]
    later = [job(f"T-later-{i}", 3600) for i in range(2)]
    dead, done = job("T-dead", -60), job("T-done", -120)
    kill_timeout_jobs([dead], error="HTTP 503 from the receiver")
    kill_timeout_jobs([done], error="HTTP 502 before the requeue")
    TimeoutJob.objects.filter(pk=done.pk).update(status=TimeoutJob.Status.PROCESSED, attempts=2)
    queue.purge_dead(TOPIC, done.slot, job_ids=[str(done.pk)], limit=1)

    metrics.record(TOPIC, {"dispatched": 4, "delivered": 3, "dead": 1}, [THREE_DAYS_MS] * 3)
    clock = time.time()
    for minutes_ago, n in ((3, 9), (2, 7), (1, 5)):
        metrics.sample_backlog(TOPIC, backlog=n, overdue=3, now=clock - 60 * minutes_ago)
    leases.heartbeat(
        leases.WorkerInfo(worker_id="trust-w1", heartbeat_ms=epoch_ms(), load={TOPIC: [2, 8000, 8]})
    )
    rates.take(TOPIC, 100, 50, now_ms=epoch_ms() - 60_000)  # emptied (10 granted) ...
    rates.take(TOPIC, 100, 40, now_ms=epoch_ms() - 60_000)  # ... 40 refused: no job held back

    coupon = CouponFactory(name="Trusted coupon", total_stock=10)
    claims = [coupon_services.coupon_claim(coupon_id=coupon.pk, user_id=u) for u in (21, 22, 23)]
    UserCoupon.objects.filter(pk=claims[0].pk).update(
        status=UserCoupon.Status.USED, used_at=timezone.now()
    )
    return {
        "overdue": overdue, "later": later, "dead": dead, "done": done, "coupon": coupon,
    }  # fmt: skip


@pytest.fixture
def page(live_server, workload, monkeypatch):
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - as the other browser tests

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        tab = chromium.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        tab.set_default_timeout(15_000)
        user = UserFactory(is_staff=True, is_superuser=True)
        tab.goto(f"{live_server.url}/admin/login/")
        tab.fill("#id_username", user.username)
        tab.fill("#id_password", PASSWORD)
        tab.click("input[type=submit]")
        tab.wait_for_selector("#site-name")
        try:
            yield tab
        finally:
            chromium.close()


def test_every_console_page_shows_true_numbers(page, live_server, workload, screenshots):
    url = live_server.url
    dead, done = workload["dead"], workload["done"]

    # The console: lateness past the last bucket, the rate limit, threads apart from capacity.
    page.goto(f"{url}/admin/console/")
    row = page.locator(f'#cc-timeout-topics tr[data-topic="{TOPIC}"]')
    cells = [c.strip() for c in row.locator("td").all_inner_texts()]
    assert "> 10 min / > 10 min" in cells, cells
    assert "100/s, 10 tokens, 0 jobs held back" in cells, cells
    assert row.locator(".cc-threads").inner_text() == "8 in 1 worker"
    assert row.locator(".cc-taken-in").inner_text() == "2 / 8000 (0%)"
    assert "3 / 0 / 1" in cells, cells  # the hour: fired / failed / dead
    header = page.locator("h3", has_text=f"{TOPIC} (").inner_text()
    assert "4 dispatched, 3 delivered, 0 failed, 1 dead, 0 dropped" in header, header
    chart = page.locator(f"svg.cc-chart[aria-label='{TOPIC}: per minute']")
    assert chart.locator(".cc-legend[data-key=dead]").count() == 1
    assert re.fullmatch(r"\d\d:\d\d:\d\d UTC", page.inner_text("#cc-updated"))
    shot(page, screenshots, "trust-console")

    # The queue page: the backlog now and over time, its jobs filtered, a bulk action.
    page.click(f'#cc-timeout-topics tr[data-topic="{TOPIC}"] a.cc-queue')
    page.wait_for_selector("#q-totals")
    figures = {k: page.inner_text(f"#q-{k}") for k in ("store", "due", "prepare", "dead")}
    assert figures == {"store": "5", "due": "3", "prepare": "0", "dead": "1"}, figures
    assert page.inner_text("#q-lateness") == "> 10 min / > 10 min"
    backlog_chart = page.locator(f"svg.cc-chart[aria-label^='{TOPIC}: backlog']")
    assert backlog_chart.locator("[data-line=backlog]").count() >= 1
    shot(page, screenshots, "trust-queue")
    page.click("#q-filter a[data-status=pending]")
    page.wait_for_url(re.compile(r"status=pending"))
    assert page.locator("#q-jobs tbody tr[data-job]").count() == 5
    page.check("#q-all")
    page.check("#q-across")
    page.select_option("#q-action", "cancel_jobs")
    page.click("#q-go")
    page.wait_for_selector("#tj-confirm")
    assert page.inner_text("#tj-confirm-count") == "5"
    shot(page, screenshots, "trust-queue-bulk-cancel-confirm")
    page.goto(f"{url}/admin/console/queue/{TOPIC}/")  # not confirmed: nothing changes

    # The jobs list: times to the second, in UTC; an error before a success is history.
    page.goto(f"{url}/admin/reminders/timeoutjob/?topic__exact={TOPIC}")
    assert SECONDS_AND_ZONE.search(page.inner_text("#result_list"))
    assert "p.m." not in page.inner_text("#result_list")
    shot(page, screenshots, "trust-jobs")

    # A job that succeeded after a requeue: read-only, its old error marked as history.
    page.goto(f"{url}/admin/reminders/timeoutjob/{done.pk}/change/")
    assert page.locator("input[name=_save], input[name=_addanother], a.deletelink").count() == 0
    assert "Gmt" not in page.inner_text("#content")
    assert page.inner_text("#tj-error").startswith("none now (processed); before that: HTTP 502")
    shot(page, screenshots, "trust-job-done")

    # The dead letters: business key, and the job a click away; there, Requeue.
    page.goto(f"{url}/admin/reminders/deadletter/?topic={TOPIC}")
    letter = page.locator(f'#dl-table tr[data-job="{dead.pk}"]')
    assert letter.locator(".dl-key").inner_text() == "order:T-dead"
    shot(page, screenshots, "trust-dead-letters")
    letter.locator("a.dl-row").click()
    page.wait_for_selector("#tj-requeue")
    assert page.inner_text("#tj-error") == "HTTP 503 from the receiver"
    shot(page, screenshots, "trust-job-dead")
    page.click("#tj-requeue")
    page.wait_for_selector(".messagelist")
    assert f"Job {dead.pk} requeued" in page.inner_text(".messagelist")
    assert TimeoutJob.objects.get(pk=dead.pk).status == TimeoutJob.Status.PENDING
    assert page.locator("#tj-cancel").count() == 1  # pending again: it may be cancelled
    page.click("#tj-cancel")
    page.wait_for_selector(".messagelist")
    assert TimeoutJob.objects.get(pk=dead.pk).status == TimeoutJob.Status.CANCELLED

    # The topics list: built-in topics, a backlog column, "running" rather than a red cross.
    page.goto(f"{url}/admin/reminders/timeouttopic/")
    listed = page.locator("#result_list tbody tr", has_text=TOPIC)
    assert "running" in listed.inner_text() and listed.locator("img[alt=False]").count() == 0
    # scheduled / due / in flight / dead: the requeued job was cancelled since
    assert "5 / 3 / 0 / 0" in listed.inner_text()
    builtin = page.locator("#builtin-topics tr[data-topic]")
    assert sorted(builtin.evaluate_all("rows => rows.map(r => r.dataset.topic)")) == [
        "order.close", "timeout.default",
    ]  # fmt: skip
    shot(page, screenshots, "trust-topics")

    # The coupon page links its claims.
    page.goto(f"{url}/admin/couponcenter/coupon/{workload['coupon'].pk}/change/")
    assert page.inner_text("#coupon-claims") == "3"
    assert page.inner_text("#coupon-redeemed") == "1"
    shot(page, screenshots, "trust-coupon")
    page.click("#coupon-claims")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 3
    shot(page, screenshots, "trust-coupon-claims")
