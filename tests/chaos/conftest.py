"""The chaos suite: real processes (``stack`` from tests/e2e), real Redis and PostgreSQL, faults.

Every scenario ends with the same verdicts: each subscription's user has exactly one inbox row
(nothing lost, nothing shown twice), every subscription is ``sent``, Redis holds nothing for them
(store, prepare and dead empty), and every due coupon expired exactly once.

The suite needs PostgreSQL (SQLite has neither the row locks nor the connection faults under test).
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from reminders.engine.keys import slot_for
from reminders.models import Notification, ReminderSubscription
from reminders.services import subscriptions_rebuild
from tests.chaos.faults import RedisServer, TcpProxy
from tests.e2e.conftest import (  # noqa: F401  (fixtures shared with the e2e tests)
    backlog,
    receiver_factory,
    reminder_settings,
    stack,
    wait_for,
)
from tests.support.factories import CouponFactory

Status = ReminderSubscription.Status
LEAD = timedelta(seconds=60)


def pytest_collection_modifyitems(config, items):
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(
        reason="the chaos suite needs PostgreSQL (row locks, connection faults): "
        "set DATABASE_URL=postgres://... (CI does)"
    )
    for item in items:
        if "chaos" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request) -> random.Random:
    """Random delays, seeded per test and printed on failure, so a failing run can be replayed."""
    seed = random.randrange(2**32)
    request.node.user_properties.append(("seed", seed))
    print(f"chaos seed: {seed}")
    return random.Random(seed)


@pytest.fixture
def private_redis(settings, tmp_path):
    """A redis-server of this test's own (restart and flush are allowed), used by this process
    too. Request it before ``stack`` so it outlives the processes using it."""
    server = RedisServer(tmp_path / "redis").start()
    settings.REDIS_URL = server.url
    settings.CELERY_BROKER_URL = server.url
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_proxy():
    """A TCP proxy in front of this test's PostgreSQL; ``database_url()`` goes through it."""
    db = connection.settings_dict
    proxy = TcpProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    proxy.database_url = (
        f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"  # trust auth in CI
    )
    try:
        yield proxy
    finally:
        proxy.close()


# --- reminders due over a stretch of time ------------------------------------------------------


def reminders_due_over(*, users: int, start_s: float, spread_s: float, coupons: int = 20,
                       slots: int = 16, first_user: int = 1,
                       exact: bool = True) -> dict[int, int]:  # fmt: skip
    """``users`` subscriptions, one per user, due between now+start_s and now+start_s+spread_s
    (coupons open evenly over the stretch). Rows in bulk, indexed the way a rebuild does.
    Returns {user_id: subscription id}. ``exact``: the rebuild must have indexed these rows and
    no others (not so while workers run: a reminder claimed between the rebuild's look at the
    parcels and its NX write is indexed again, and delivered once all the same)."""
    now = timezone.now()
    step = spread_s / max(1, coupons - 1)
    made = [
        CouponFactory(
            name=f"Chaos {i}",
            total_stock=users + 1,
            claim_opens_at=now + LEAD + timedelta(seconds=start_s + step * i),
        )
        for i in range(coupons)
    ]  # fmt: skip
    user_ids = range(first_user, first_user + users)
    subs = ReminderSubscription.objects.bulk_create(
        ReminderSubscription(
            coupon=made[i % coupons],
            user_id=u,
            remind_at=made[i % coupons].claim_opens_at - LEAD,
            slot=slot_for(u, slots),
        )
        for i, u in enumerate(user_ids)
    )
    indexed = subscriptions_rebuild()
    assert indexed == users if exact else indexed >= users
    return {s.user_id: s.pk for s in subs}


def inbox_per_user() -> Counter:
    return Counter(Notification.objects.values_list("user_id", flat=True))


def assert_each_notified_once(subs: dict[int, int]) -> None:
    """One inbox row per user, naming exactly that user's subscription; all sent; Redis empty."""
    per_user = inbox_per_user()
    lost = [u for u in subs if per_user[u] == 0]
    doubled = {u: n for u, n in per_user.items() if n > 1}
    assert not lost and not doubled, f"lost {len(lost)}: {lost[:20]}; doubled: {doubled}"
    assert set(per_user) == set(subs)
    named = Counter(
        s for payload in Notification.objects.values_list("payload", flat=True)
        for s in payload["subscriptions"]
    )  # fmt: skip
    assert named == dict.fromkeys(subs.values(), 1)
    statuses = Counter(ReminderSubscription.objects.values_list("status", flat=True))
    assert statuses == {Status.SENT: len(subs)}, statuses
    assert backlog() == {"store": 0, "prepare": 0, "dead": 0}


def wait_all_notified(subs: dict[int, int], running, *, timeout: float) -> None:
    wait_for(
        lambda: (
            Notification.objects.count() >= len(subs)
            and not ReminderSubscription.objects.filter(status=Status.SCHEDULED).exists()
        ),
        timeout=timeout,
        interval=0.25,
        what=f"{len(subs)} users notified\n{running.logs()}",
    )
    # Anything still in flight (a redelivery racing the last ack) settles: wait for Redis to
    # empty instead of sleeping a fixed time.
    wait_for(
        lambda: backlog() == {"store": 0, "prepare": 0, "dead": 0},
        timeout=timeout,
        interval=0.25,
        what=f"Redis to drain: {backlog()}\n{running.logs()}",
    )
