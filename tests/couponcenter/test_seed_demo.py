"""seed_demo: demo data in every state, idempotent, token-only accounts."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from couponcenter.coupons.models import Coupon, UserCoupon
from reminders.models import ReminderSubscription

pytestmark = pytest.mark.django_db


def seed() -> str:
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def snapshot() -> tuple:
    return (
        Coupon.objects.count(),
        UserCoupon.objects.count(),
        ReminderSubscription.objects.count(),
        get_user_model().objects.count(),
    )


def test_seed_demo_is_idempotent():
    first = seed()
    counts = snapshot()
    second = seed()
    assert snapshot() == counts
    tokens = [line.split("Token ")[1].split()[0] for line in first.splitlines() if "Token " in line]
    assert len(tokens) >= 2
    assert all(token in second for token in tokens[:2])


def test_seed_demo_covers_each_state(client_for):
    seed()
    now = timezone.now()
    coupons = {c.name: c for c in Coupon.objects.all()}
    assert coupons["Demo: open now"].claim_opens_at <= now
    assert coupons["Demo: open now"].claimed_count >= 2
    soon = coupons["Demo: opens in 3 minutes"].claim_opens_at
    assert now + timedelta(minutes=2) < soon <= now + timedelta(minutes=3)
    assert coupons["Demo: opens tomorrow"].claim_opens_at > now + timedelta(hours=23)
    assert coupons["Demo: cancelled"].status == Coupon.Status.CANCELLED
    assert ReminderSubscription.objects.filter(coupon=coupons["Demo: opens in 3 minutes"]).exists()


def test_seed_demo_accounts_use_tokens_not_passwords(anon):
    output = seed()
    users = get_user_model().objects.filter(username__startswith="demo-")
    assert users.count() == 2
    assert not any(user.has_usable_password() for user in users)
    service = users.get(username="demo-service")
    assert service.has_perm("couponcenter.act_for_any_user")
    user_token = output.split("demo-user-1001")[1].split("Token ")[1].split()[0]
    anon.credentials(HTTP_AUTHORIZATION=f"Token {user_token}")
    assert anon.get("/api/users/1001/coupons/").data["count"] == 1
    assert anon.get("/api/users/1002/coupons/").status_code == 403


def test_seed_demo_moves_the_soon_coupon_only_when_asked():
    """``make run`` seeds on every start: a rerun leaves the demo coupon where it was, and
    ``--reopen-soon`` moves it 3 minutes out again once it opened."""
    seed()
    soon = Coupon.objects.get(name="Demo: opens in 3 minutes")
    opened = timezone.now() - timedelta(hours=1)
    Coupon.objects.filter(pk=soon.pk).update(claim_opens_at=opened)
    out = seed()
    soon.refresh_from_db()
    assert soon.claim_opens_at == opened and "moved" not in out
    assert "--reopen-soon" in out  # says how to move it
    call_command("seed_demo", "--reopen-soon", stdout=io.StringIO())
    soon.refresh_from_db()
    assert soon.claim_opens_at > timezone.now() + timedelta(minutes=2)


def test_a_rerun_says_what_it_did_and_where_the_service_answers():
    seed()
    soon = Coupon.objects.get(name="Demo: opens in 3 minutes")
    ReminderSubscription.objects.filter(coupon=soon, user_id__in=[1001, 2001]).update(
        status=ReminderSubscription.Status.SENT
    )
    out = io.StringIO()
    call_command("seed_demo", "--url", "http://127.0.0.1:8100/", stdout=out)
    text = out.getvalue()
    assert "(0 new): 19 scheduled for" in text and "2 sent on an earlier run" in text, text
    assert "http://127.0.0.1:8100/api/users/1001/coupons/" in text
    assert ":8000" not in text
