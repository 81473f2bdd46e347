"""The operations console in a real browser: Playwright driving Debian's Chromium against
pytest-django's live server, real Redis and the real database (committed rows: transactional).

Each test saves a screenshot in the ``screenshots`` directory (tests/e2e/conftest.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.conf import settings

from reminders.members import REMINDER_TOPIC
from reminders.models import ReminderSettings
from tests.e2e.conftest import wait_for
from tests.support.console import dead_members, kill_reminders, member, overdue_reminders
from tests.support.factories import UserFactory

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct-horse-battery"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)",
    ),
]


@pytest.fixture
def page(live_server, transactional_db, monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        tab = context.new_page()
        tab.set_default_timeout(15_000)
        try:
            yield tab
        finally:
            context.close()
            browser.close()


@pytest.fixture
def logged_in(page, live_server):
    user = UserFactory(is_staff=True, is_superuser=True)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    return page


def shot(page, where: Path, name: str) -> None:
    """A full-page screenshot ``<name>.png`` in ``where`` (the ``screenshots`` fixture)."""
    page.screenshot(path=str(where / f"{name}.png"), full_page=True)


def test_login_and_overview_shows_a_known_backlog(
    screenshots, logged_in, live_server, reminder_settings
):
    reminder_settings.change(backlog_warning=10)
    overdue_reminders(range(8000, 8012))
    page = logged_in
    page.goto(f"{live_server.url}/admin/")
    page.click("#ops-console-link a")
    page.wait_for_selector("#cc-backlog")
    assert page.inner_text("#total-due") == "12"
    assert page.inner_text("#total-store") == "12"
    assert "Overdue backlog is 12 entries" in page.inner_text("#cc-warning-1")
    row = page.locator(f'#cc-backlog tr.cc-total[data-topic="{REMINDER_TOPIC}"]')
    assert row.locator("td").nth(2).inner_text() == "12"
    # Counts and lateness per topic: the two reminder topics and the generic ones in settings.
    topics = 2 + len(settings.TIMEOUT_TOPICS)
    assert page.locator("svg.cc-chart").count() == 2 * topics
    assert page.locator("#cc-timeout-topics tr[data-topic]").count() == len(settings.TIMEOUT_TOPICS)
    shot(page, screenshots, "console-overview")


def test_requeue_a_dead_letter_from_the_list(
    screenshots, logged_in, live_server, reminder_settings
):
    subs = overdue_reminders(range(8100, 8104))
    kill_reminders(subs)
    target = subs[0]
    page = logged_in
    page.goto(f"{live_server.url}/admin/reminders/deadletter/")
    assert page.locator("#dl-table tbody tr").count() == 4
    page.check(f'tr[data-job="{member(target)}"] input.action-select')
    page.select_option("#dl-action", "requeue_selected")
    page.click("#dl-go")
    assert page.inner_text("#dl-confirm-count") == "1"
    shot(page, screenshots, "dead-letters-confirm")
    page.click("#dl-confirm")
    page.wait_for_selector(".messagelist")
    assert "Requeued 1 dead letter" in page.inner_text(".messagelist")
    assert page.locator(f'tr[data-job="{member(target)}"]').count() == 0
    assert page.locator("#dl-table tbody tr").count() == 3
    assert member(target) not in dead_members() and len(dead_members()) == 3
    target.refresh_from_db()
    assert target.status == "scheduled"
    shot(page, screenshots, "dead-letters-after-requeue")


def test_batch_size_change_is_picked_up_by_a_running_worker(
    screenshots, logged_in, live_server, reminder_settings, stack
):
    worker = stack.start_reminder_worker()
    page = logged_in
    page.goto(f"{live_server.url}/admin/reminders/remindersettings/")
    version = ReminderSettings.objects.get().version
    row = page.locator(f'#cc-config-workers tr[data-pid="{worker.popen.pid}"]')
    assert row.locator(".cc-config-version").inner_text() == f"v{version}"
    page.fill("#id_batch_size", "1234")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist")
    assert ReminderSettings.objects.get().batch_size == 1234

    def picked_up() -> bool:
        page.reload()
        cell = page.locator(f'#cc-config-workers tr[data-pid="{worker.popen.pid}"] td').nth(4)
        return cell.inner_text() == "yes"

    wait_for(picked_up, timeout=20, interval=0.5, what="the worker to report the new version")
    text = row.locator(".cc-config-version").inner_text()
    assert text == f"v{version + 1}"
    shot(page, screenshots, "config-picked-up")


def test_invalid_slot_count_shows_a_form_error(
    screenshots, logged_in, live_server, reminder_settings
):
    page = logged_in
    page.goto(f"{live_server.url}/admin/reminders/remindersettings/")
    before = ReminderSettings.objects.get()
    page.fill("#id_slots", "12")
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    assert re.search(r"12 is not a power of two", page.inner_text(".field-slots"))
    after = ReminderSettings.objects.get()
    assert (after.slots, after.version) == (before.slots, before.version)
    shot(page, screenshots, "config-invalid-slots")
