"""The console shows when and why background work was held back (docs/operations.md): the urgent
paths' signal against their targets, and per background job its state, since when, the path it
waits for with the signal's value, and the time held back today; real Redis and database,
Django test client."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from couponcenter.core.holdback import Holdback
from couponcenter.core.urgency import UrgencySignal
from expiry.sweeper import Sweeper
from expiry.window import EXPIRY_SWEEP
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from tests.support.factories import ExpiryTaskFactory, UserCouponFactory, UserFactory

pytestmark = pytest.mark.django_db
PAGE = "/admin/console/"


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def section(html: str, table_id: str, attr: str, value: str) -> str:
    table = re.search(rf'<table[^>]*id="{table_id}".*?</table>', html, re.S)
    assert table, f"no table {table_id}"
    found = re.search(rf'<tr {attr}="{value}".*?</tr>', table.group(0), re.S)
    assert found, f"no row {value} in {table_id}"
    return found.group(0)


def test_the_console_shows_the_sweep_held_back_and_why(staff, reminder_settings, settings):
    settings.URGENT_REMINDERS_TARGET_MS = 1000
    settings.URGENCY_CACHE_MS = 0
    html = staff.get(PAGE).content.decode()
    assert "No background job has been held back." in html
    assert "on target" in section(html, "cc-urgent", "data-path", "reminders")

    now = epoch_ms()
    queue.schedule(REMINDER_TOPIC, "late", now - 60_000, slot=0, now_ms=now)
    clock = [now - 5000]
    hold = Holdback(EXPIRY_SWEEP, signal=UrgencySignal(clock=lambda: clock[0]))
    assert hold.check()
    clock[0] += 2000
    assert hold.check()

    html = staff.get(PAGE, {"partial": 1}).content.decode()
    urgent = section(html, "cc-urgent", "data-path", "reminders")
    assert "cc-bad" in urgent and "1 min" in urgent and "1.0 s" in urgent
    row = section(html, "cc-holdback", "data-job", EXPIRY_SWEEP)
    assert "held back" in row and "reminders" in row
    assert "57.0 s / 1.0 s" in row  # the signal's value when it last looked, and the target
    assert '<td class="cc-held-today">2.0 s</td>' in row

    queue.cancel(REMINDER_TOPIC, "late", slot=0)
    clock[0] += 1000
    assert not hold.check()
    row = section(staff.get(PAGE).content.decode(), "cc-holdback", "data-job", EXPIRY_SWEEP)
    assert "running" in row and "ended" in row and "held back" not in row
    assert '<td class="cc-held-today">3.0 s</td>' in row


def test_a_sweep_past_its_window_says_it_runs_although_behind(staff, reminder_settings, settings):
    settings.URGENCY_CACHE_MS = 0
    settings.HOLDBACK_POLL_MS = 10
    now = epoch_ms()
    queue.schedule(REMINDER_TOPIC, "late", now - 60_000, slot=0, now_ms=now)
    due = timezone.now() - timedelta(minutes=1)  # a task due: the sweep has work to hold back
    ExpiryTaskFactory(user_coupon=UserCouponFactory(expires_at=due), expire_at=due)
    sweeper = Sweeper(batch_size=10)
    sweeper.hold.must_run = lambda now_ms: "expiry window: test"
    sweeper.run_once()
    row = section(staff.get(PAGE).content.decode(), "cc-holdback", "data-job", EXPIRY_SWEEP)
    assert "running although behind: expiry window: test" in row
