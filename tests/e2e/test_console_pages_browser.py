"""The console and the admin as operators see them, in Chromium (Playwright) against the live
server, real Redis and the real database: every page at 1280 and 1920 px without sideways
scrolling, chart axes in real units, the p99 headline true to the recorded lateness within the
histogram's stated precision, and a live refresh that does not reload the page. Screenshots go
to the ``screenshots`` directory (tests/e2e/conftest.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from reminders import metrics
from reminders.members import REMINDER_TOPIC
from reminders.models import TimeoutJob
from reminders.services import timeout_job_create
from tests.e2e.test_console_browser import ARGS, CHROMIUM, PASSWORD, shot
from tests.support.console import kill_reminders, overdue_reminders
from tests.support.factories import CouponFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGES = [
    "/",
    "/admin/",
    "/admin/console/?range=5m",
    "/admin/console/",
    "/admin/console/?range=24h",
    "/admin/console/queue/timeout.default/",
    "/admin/console/queue/coupon.reminder/",
    "/admin/console/retention/",
    "/admin/couponcenter/coupon/",
    "/admin/couponcenter/usercoupon/",
    "/admin/reminders/remindersettings/",
    "/admin/reminders/remindersubscription/",
    "/admin/reminders/notification/",
    "/admin/reminders/timeoutjob/",
    "/admin/reminders/timeouttopic/",
    "/admin/reminders/deadletter/",
    "/admin/expiry/expirysettings/",
    "/admin/expiry/expirytask/",
]
AXIS = re.compile(r"^(0|\d+(\.\d+)? (ms|s|min|h))$")


@pytest.fixture
def browser(live_server, transactional_db, monkeypatch):
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def _signed_in(browser, live_server, width: int):
    context = browser.new_context(viewport={"width": width, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(15_000)
    user = UserFactory(is_staff=True, is_superuser=True)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    return page


@pytest.fixture
def populated(reminder_settings):
    """Enough of everything that the lists have rows and the charts lines."""
    for i in range(12):
        CouponFactory(name=f"A coupon with a fairly long name, number {i}")
    subs = overdue_reminders(range(9000, 9030))
    kill_reminders(subs[:5])
    for i in range(20):
        timeout_job_create(topic="timeout.default", biz_type="order", biz_id=f"ORD-{i}",
                           action_time=timezone.now() + timedelta(minutes=i))  # fmt: skip
    for minute in range(0, 50, 5):
        metrics.record(
            REMINDER_TOPIC,
            {"dispatched": 100, "delivered": 100},
            [30] * 90 + [700] * 10,
            now=timezone.now().timestamp() - minute * 60,
        )
    return subs


@pytest.mark.parametrize("width", [1280, 1920])
def test_every_page_fits_without_sideways_scrolling(
    screenshots, browser, live_server, populated, width
):
    page = _signed_in(browser, live_server, width)
    for path in PAGES:
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == 200, (path, response.status)
        scroll = page.evaluate("document.documentElement.scrollWidth")
        name = re.sub(r"\W+", "-", path).strip("-") or "home"
        shot(page, screenshots, f"page-{width}-{name}")
        assert scroll <= width, f"{path} scrolls sideways at {width} px ({scroll} px wide)"
        # A list's table fits its box too (it may scroll inside it, but need not).
        clipped = page.evaluate(
            "(() => { const r = document.querySelector('#changelist .results');"
            " return r ? r.scrollWidth - r.clientWidth : 0; })()"
        )
        assert clipped <= 1, f"{path}: the list is {clipped} px wider than its box at {width} px"


def test_chart_axes_read_in_real_units(screenshots, browser, live_server, populated):
    metrics.record(REMINDER_TOPIC, {"delivered": 2}, [47_000, 52_000])  # seconds late
    page = _signed_in(browser, live_server, 1280)
    page.goto(f"{live_server.url}/admin/console/")
    labels = page.locator("svg.cc-chart[aria-label$='lateness p50 and p99 per minute'] .cc-axis")
    texts = [t.strip() for t in labels.all_text_contents()]
    assert texts and all(AXIS.match(t) for t in texts), texts
    assert not any("kms" in t for t in texts)
    assert any(t.endswith(" s") for t in texts), texts  # 52 s late: the axis is in seconds
    counts = page.locator(f"svg.cc-chart[aria-label='{REMINDER_TOPIC}: per minute']")
    # Dispatched is drawn beneath delivered, wide, so equal counts leave both visible.
    assert counts.locator("[data-line=dispatched]").first.get_attribute("stroke-width") == "5"
    shot(page, screenshots, "console-units")


def test_the_p99_headline_matches_the_recorded_lateness(
    screenshots, browser, live_server, reminder_settings
):
    samples = [40] * 980 + [47_000] * 20  # p99 falls among the 47 s samples
    metrics.record(REMINDER_TOPIC, {"delivered": len(samples)}, samples)
    true_p99 = sorted(samples)[int(0.99 * len(samples)) - 1]
    page = _signed_in(browser, live_server, 1280)
    page.goto(f"{live_server.url}/admin/console/")
    card = page.locator("#cc-p99")
    shown = int(card.get_attribute("data-p99-ms"))
    low, high = int(card.get_attribute("data-low-ms")), int(card.get_attribute("data-high-ms"))
    assert low <= true_p99 <= high, (low, true_p99, high)  # the stated precision holds
    assert low <= shown <= high and high - low <= 15_000
    text = card.inner_text()
    assert re.search(r"\d+(\.\d)? s", text) and "interpolated" in text, text
    assert "60000" not in text and "ms" not in text.split("\n")[1]
    shot(page, screenshots, "console-p99")


def test_live_refresh_updates_without_reloading(
    screenshots, browser, live_server, reminder_settings
):
    page = _signed_in(browser, live_server, 1280)
    page.goto(f"{live_server.url}/admin/console/")
    page.evaluate("window.__stillHere = true")
    before = page.inner_text("#total-store")
    overdue_reminders(range(9500, 9507))
    page.wait_for_function(
        f"document.getElementById('total-store').innerText !== {before!r}", timeout=30_000
    )
    assert page.inner_text("#total-store") == str(int(before) + 7)
    assert page.evaluate("window.__stillHere === true")  # the same document: no reload
    page.uncheck("#cc-live-toggle")
    shot(page, screenshots, "console-live")


def test_search_and_bulk_cancel_timeout_jobs(screenshots, browser, live_server, populated):
    """Look a job up by its business key; then cancel a filtered selection, behind a
    confirmation page."""
    page = _signed_in(browser, live_server, 1280)
    page.goto(f"{live_server.url}/admin/reminders/timeoutjob/?q=order:ORD-7")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "ORD-7" in page.inner_text("#result_list tbody tr")
    page.goto(f"{live_server.url}/admin/reminders/timeoutjob/?topic__exact=timeout.default")
    page.check("#action-toggle")
    page.select_option("select[name=action]", "cancel_jobs")
    page.click("button[name=index]")
    page.wait_for_selector("#tj-confirm")
    assert page.inner_text("#tj-confirm-count") == "20"
    assert TimeoutJob.objects.filter(status=TimeoutJob.Status.PENDING).count() == 20
    shot(page, screenshots, "timeouts-bulk-cancel-confirm")
    page.click("#tj-confirm")
    page.wait_for_selector(".messagelist")
    assert "Cancelled 20 job(s)" in page.inner_text(".messagelist")
    assert TimeoutJob.objects.filter(status=TimeoutJob.Status.CANCELLED).count() == 20
