"""The claims-over-HTTP benchmark against a real gunicorn: it audits its sale and then leaves
nothing behind (its coupon, claims and their expiry tasks once stayed in the tables that later
runs measured)."""

from __future__ import annotations

import pytest

from couponcenter.coupons.bench import http
from couponcenter.coupons.models import Coupon, UserCoupon
from expiry.models import ExpiryTask

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_small_run_audits_its_claims_and_deletes_them():
    before = (Coupon.objects.count(), UserCoupon.objects.count(), ExpiryTask.objects.count())
    result = http.run(seconds=1, stock=200, workers=1, connections=2, generator="python",
                      raw_seconds=0.5)  # fmt: skip
    assert result["status_counts"]["201"] > 0
    assert result["oversell"] is False
    assert result["user_coupon_rows"] == result["expiry_tasks"] == result["claimed_count"]
    after = (Coupon.objects.count(), UserCoupon.objects.count(), ExpiryTask.objects.count())
    assert after == before
