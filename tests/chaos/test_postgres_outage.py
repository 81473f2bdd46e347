"""Chaos: PostgreSQL unreachable for 10 s under every process at once.

The reminder worker, the Celery worker, the expiry sweeper and a gunicorn web process reach
PostgreSQL through a TCP proxy; the proxy refuses new connections and resets the open ones for
10 s, then lets them through again. The processes run with the production connection settings
(persistent connections with health checks). They must report the outage (503 from /healthz/,
errors in their logs), keep retrying, and recover without a restart: afterwards every reminder is
in the inbox once, every due coupon expired, and the API answers again.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from couponcenter.coupons.models import Coupon, UserCoupon
from expiry import services as expiry_services
from expiry.models import ExpiryTask
from reminders.models import Notification
from tests.chaos.conftest import (
    assert_each_notified_once,
    reminders_due_over,
    wait_all_notified,
    wait_for,
)
from tests.chaos.faults import free_port
from tests.support.factories import CouponFactory, api_user

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

OUTAGE_S = 10
EXPIRING = 600


@dataclass
class Probe:
    at: float
    what: str
    status: int  # 0: no HTTP answer at all


class Prober(threading.Thread):
    """Calls /healthz/ and claims a coupon through the API every 0.2 s, recording what it got."""

    def __init__(self, base: str, token: str, coupon_id: int):
        super().__init__(daemon=True)
        self.base, self.coupon_id = base, coupon_id
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"
        self.probes: list[Probe] = []
        self.stop = threading.Event()
        self.user = 900_000

    def call(self, what: str, method: str, path: str, **kw) -> None:
        try:
            status = self.session.request(method, self.base + path, timeout=10, **kw).status_code
        except requests.RequestException:
            status = 0
        self.probes.append(Probe(time.monotonic(), what, status))

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.user += 1
            self.call("health", "GET", "/healthz/")
            self.call("claim", "POST", f"/api/users/{self.user}/coupons/",
                      json={"coupon": self.coupon_id})  # fmt: skip

    def between(self, start: float, end: float, what: str) -> list[int]:
        return [p.status for p in self.probes if start <= p.at <= end and p.what == what]


def _coupons_expiring_over(*, start_s: float, spread_s: float) -> Coupon:
    """``EXPIRING`` claimed coupons with their expiry tasks, falling due over the stretch."""
    now = timezone.now()
    coupon = CouponFactory(name="Expiring", total_stock=EXPIRING)
    at = [now + timedelta(seconds=start_s + spread_s * i / EXPIRING) for i in range(EXPIRING)]
    claims = UserCoupon.objects.bulk_create(
        UserCoupon(coupon=coupon, user_id=500_000 + i, claimed_at=now, expires_at=at[i])
        for i in range(EXPIRING)
    )
    ExpiryTask.objects.bulk_create(
        ExpiryTask(user_coupon=uc, expire_at=uc.expires_at) for uc in claims
    )
    Coupon.objects.filter(pk=coupon.pk).update(claimed_count=EXPIRING)
    return coupon


def test_postgres_down_for_10_s_under_worker_celery_sweeper_and_api(
    stack, reminder_settings, pg_proxy
):
    reminder_settings.change(
        slots=8, batch_size=50, visibility_timeout_ms=3000, tick_interval_ms=100
    )  # fmt: skip (max_attempts: the default 3)
    config = expiry_services.expiry_settings_get(max_age_s=0)
    config.interval = timedelta(seconds=1)
    expiry_services.expiry_settings_save(instance=config)
    _, token = api_user(perms=["couponcenter.act_for_any_user"])
    open_coupon = CouponFactory(name="Open", total_stock=100_000)

    stack.env["DATABASE_URL"] = pg_proxy.database_url
    stack.env.pop("DB_CONN_MAX_AGE")  # the production default: persistent, health-checked
    port = free_port()
    web = stack._start("web", [sys.executable, "-m", "gunicorn", "couponcenter.wsgi",
                               "--bind", f"127.0.0.1:{port}", "--workers", "2",
                               "--timeout", "60"])  # fmt: skip
    sweeper = stack._start("sweeper", [sys.executable, "manage.py", "run_expiry_sweeper"])
    stack.start()
    worker = stack.procs[-1]
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _ok(base + "/healthz/"), timeout=60, what=f"gunicorn\n{web.output()}")

    subs = reminders_due_over(users=1000, start_s=2, spread_s=20)
    expiring = _coupons_expiring_over(start_s=2, spread_s=20)
    prober = Prober(base, token, open_coupon.pk)
    prober.start()
    try:
        wait_for(lambda: Notification.objects.exists()
                 and ExpiryTask.objects.filter(status="processed").exists(),
                 timeout=30, interval=0.05, what=f"first deliveries\n{stack.logs()}")  # fmt: skip

        pg_proxy.cut()
        cut_at = time.monotonic()
        time.sleep(OUTAGE_S)  # the outage itself
        pg_proxy.restore()
        restored_at = time.monotonic()

        # Reported: health says 503 (or the request fails), claims fail, the loops log errors.
        assert set(prober.between(cut_at + 1, restored_at, "health")) <= {503, 0}
        assert 503 in prober.between(cut_at + 1, restored_at, "health")
        failed_claims = prober.between(cut_at + 1, restored_at, "claim")
        assert failed_claims, "no claim was tried during the outage: the fault proved nothing"
        assert all(s >= 500 or s == 0 for s in failed_claims)
        # Recovered, without a restart.
        wait_for(lambda: prober.between(restored_at, time.monotonic(), "health")[-3:] == [200] * 3
                 and prober.between(restored_at, time.monotonic(), "claim")[-3:] == [201] * 3,
                 timeout=60, what=f"the API to recover\n{web.output()[-3000:]}")  # fmt: skip
    finally:
        prober.stop.set()
        prober.join(timeout=30)

    wait_all_notified(subs, stack, timeout=120)
    assert_each_notified_once(subs)
    wait_for(lambda: not ExpiryTask.objects.filter(status="pending",
                                                   user_coupon__coupon=expiring).exists(),
             timeout=60, what=f"every due coupon expired\n{sweeper.output()[-3000:]}")  # fmt: skip
    claims = UserCoupon.objects.filter(coupon=expiring)
    assert claims.filter(status="expired").count() == EXPIRING
    assert ExpiryTask.objects.filter(user_coupon__coupon=expiring, status="processed").count() \
        == EXPIRING  # fmt: skip

    assert "tick failed" in worker.output() and "OperationalError" in worker.output()
    assert "expiry: pass failed" in sweeper.output()
    assert all(p.alive() for p in stack.procs), "every process recovered without a restart"
    # No claim half-done by the outage: the counter matches the claims and their expiry tasks.
    open_coupon.refresh_from_db()
    made = UserCoupon.objects.filter(coupon=open_coupon).count()
    assert open_coupon.claimed_count == made
    assert ExpiryTask.objects.filter(user_coupon__coupon=open_coupon).count() == made


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False
