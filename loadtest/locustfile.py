"""Locust load for the claim and subscribe endpoints (for people who want locust's UI or CSV).

    CC_TOKEN=<service-account token> CC_COUPON=<open coupon id> \\
    CC_SOON_COUPON=<coupon opening later> locust -f loadtest/locustfile.py \\
    --host http://127.0.0.1:8000 --headless -u 200 -r 50 -t 30s

The service account needs ``couponcenter.act_for_any_user`` (``manage.py shell -c "from
couponcenter.coupons.accounts import account_ensure; print(account_ensure(username='load',
act_for_any_user=True)[1])"``). Every simulated request uses a new end-user id, as in a flash sale.
``manage.py bench_claims_http`` is the project's own figure (wrk, oversell audit, raw limit).
"""

from __future__ import annotations

import itertools
import os
import random

from locust import FastHttpUser, between, task

TOKEN = os.environ.get("CC_TOKEN", "")
COUPON = int(os.environ.get("CC_COUPON", "1"))
SOON_COUPON = int(os.environ.get("CC_SOON_COUPON", os.environ.get("CC_COUPON", "1")))
# Far above real ids, and apart per locust process.
_users = itertools.count(10**12 + random.randrange(10**9) * 1000)


class CouponUser(FastHttpUser):
    wait_time = between(0, 0.01)

    def on_start(self) -> None:
        self.headers = {"Authorization": f"Token {TOKEN}", "Content-Type": "application/json"}

    @task(3)
    def claim(self) -> None:
        user_id = next(_users)
        path = f"/api/users/{user_id}/coupons/"
        with self.client.post(
            path, json={"coupon": COUPON}, headers=self.headers, name="claim", catch_response=True
        ) as r:
            if r.status_code in (201, 409):  # 409: sold out / limit: a correct answer
                r.success()

    @task(1)
    def subscribe(self) -> None:
        user_id = next(_users)
        self.client.put(f"/api/users/{user_id}/reminders/{SOON_COUPON}/", headers=self.headers,
                        name="subscribe")  # fmt: skip
