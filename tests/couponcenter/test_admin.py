"""The coupon admin: pages load, edits and the cancel action go through the services."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from couponcenter.coupons import services
from couponcenter.coupons.models import Account, Coupon, UserCoupon
from reminders.models import ReminderSubscription
from reminders.services import subscription_subscribe
from tests.support.factories import CouponFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def form_data(**overrides) -> dict:
    opens = timezone.now() + timedelta(days=1)
    data = {
        "name": "Admin coupon",
        "description": "",
        "claim_opens_at_0": opens.strftime("%Y-%m-%d"),
        "claim_opens_at_1": opens.strftime("%H:%M:%S"),
        "claim_closes_at_0": "",
        "claim_closes_at_1": "",
        "total_stock": "10",
        "per_user_limit": "1",
        "valid_for": "7 00:00:00",
        "expires_at_0": "",
        "expires_at_1": "",
        "reminder_lead": "00:01:00",
        "reminder_priority": "normal",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?status__exact=active",
        "?reminder_priority__exact=high",
        "?q=Coupon",
        "?claim_opens_at__year=2030",
    ],
)
def test_coupon_changelist(admin_client_, query):
    coupon = CouponFactory()
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    response = admin_client_.get(reverse("admin:couponcenter_coupon_changelist") + query)
    assert response.status_code == 200


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?q=77",
        "?q=abc",
        "?q=" + "9" * 30,
        "?q=-1",
        "?status__exact=used",
        "?claimed_at__year=2030",
    ],
)
def test_user_coupon_changelist(admin_client_, query):
    coupon = CouponFactory()
    services.coupon_claim(coupon_id=coupon.pk, user_id=77)
    services.coupon_claim(coupon_id=CouponFactory().pk, user_id=78)
    response = admin_client_.get(reverse("admin:couponcenter_usercoupon_changelist") + query)
    assert response.status_code == 200


def test_user_coupon_search_is_an_exact_user_id(admin_client_):
    services.coupon_claim(coupon_id=CouponFactory().pk, user_id=77)
    services.coupon_claim(coupon_id=CouponFactory().pk, user_id=770)
    url = reverse("admin:couponcenter_usercoupon_changelist")
    found = admin_client_.get(url + "?q=77").context["cl"].result_list
    assert [uc.user_id for uc in found] == [77]
    assert not admin_client_.get(url + "?q=abc").context["cl"].result_list


def test_user_coupon_is_read_only(admin_client_):
    user_coupon = services.coupon_claim(coupon_id=CouponFactory().pk, user_id=77)
    change = reverse("admin:couponcenter_usercoupon_change", args=[user_coupon.pk])
    assert admin_client_.get(change).status_code == 200
    assert admin_client_.get(reverse("admin:couponcenter_usercoupon_add")).status_code == 403
    admin_client_.post(change, {"status": "used"})
    assert UserCoupon.objects.get(pk=user_coupon.pk).status == UserCoupon.Status.UNUSED


def test_account_admin(admin_client_):
    user = UserFactory()
    account = Account.objects.create(user=user, end_user_id=5)
    url = reverse("admin:couponcenter_account_changelist")
    for query in ("", "?q=5", f"?q={user.username}", "?q=abc"):
        assert admin_client_.get(url + query).status_code == 200
    change = reverse("admin:couponcenter_account_change", args=[account.pk])
    assert admin_client_.get(change).status_code == 200


def test_add_coupon_through_the_form(admin_client_):
    response = admin_client_.post(reverse("admin:couponcenter_coupon_add"), form_data())
    assert response.status_code == 302, response.context["adminform"].form.errors
    coupon = Coupon.objects.get()
    assert (coupon.name, coupon.valid_for, coupon.status) == (
        "Admin coupon",
        timedelta(days=7),
        "active",
    )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"valid_for": ""}, "valid_for"),
        ({"total_stock": "0"}, "total_stock"),
        ({"per_user_limit": "5000"}, "per_user_limit"),
        ({"reminder_lead": "8 00:00:00"}, "reminder_lead"),
        ({"claim_opens_at_0": "not a date"}, "claim_opens_at"),
    ],
)
def test_add_coupon_shows_service_validation_as_form_errors(admin_client_, overrides, field):
    response = admin_client_.post(reverse("admin:couponcenter_coupon_add"), form_data(**overrides))
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not Coupon.objects.exists()


def test_change_coupon_goes_through_the_service(admin_client_):
    opens = timezone.now() + timedelta(hours=2)
    coupon = CouponFactory(claim_opens_at=opens)
    sub, _ = subscription_subscribe(user_id=9, coupon=coupon)
    moved = opens + timedelta(days=1)
    change = reverse("admin:couponcenter_coupon_change", args=[coupon.pk])
    data = form_data(
        name=coupon.name,
        claim_opens_at_0=moved.strftime("%Y-%m-%d"),
        claim_opens_at_1=moved.strftime("%H:%M:%S"),
    )
    response = admin_client_.post(change, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    coupon.refresh_from_db()
    assert coupon.claim_opens_at == moved.replace(microsecond=0)
    sub.refresh_from_db()
    # The service's reminder hook ran: the reminder moved with the opening.
    assert sub.remind_at == coupon.claim_opens_at - coupon.reminder_lead


def test_change_cannot_drop_stock_below_claims(admin_client_):
    coupon = CouponFactory(total_stock=5)
    for user_id in (1, 2):
        services.coupon_claim(coupon_id=coupon.pk, user_id=user_id)
    change = reverse("admin:couponcenter_coupon_change", args=[coupon.pk])
    response = admin_client_.post(change, form_data(total_stock="1"))
    assert response.status_code == 200
    assert "total_stock" in response.context["adminform"].form.errors
    assert Coupon.objects.get(pk=coupon.pk).total_stock == 5


def test_a_cancelled_coupon_is_read_only(admin_client_):
    coupon = services.coupon_cancel(coupon=CouponFactory(name="Gone"))
    change = reverse("admin:couponcenter_coupon_change", args=[coupon.pk])
    assert admin_client_.get(change).status_code == 200
    admin_client_.post(change, form_data(name="Back"))
    assert Coupon.objects.get(pk=coupon.pk).name == "Gone"


def test_cancel_action(admin_client_):
    keep = CouponFactory()
    doomed = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1))
    already = services.coupon_cancel(coupon=CouponFactory())
    sub, _ = subscription_subscribe(user_id=9, coupon=doomed)
    response = admin_client_.post(
        reverse("admin:couponcenter_coupon_changelist"),
        {"action": "cancel_selected", "_selected_action": [doomed.pk, already.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Cancelled 1 coupon" in response.content.decode()
    statuses = dict(Coupon.objects.values_list("pk", "status"))
    assert statuses == {keep.pk: "active", doomed.pk: "cancelled", already.pk: "cancelled"}
    sub.refresh_from_db()
    assert sub.status == ReminderSubscription.Status.CANCELLED


def test_coupons_cannot_be_deleted(admin_client_):
    coupon = CouponFactory()
    delete = reverse("admin:couponcenter_coupon_delete", args=[coupon.pk])
    assert admin_client_.get(delete).status_code == 403
    assert Coupon.objects.filter(pk=coupon.pk).exists()


def test_non_staff_cannot_use_the_admin():
    client = Client()
    client.force_login(UserFactory())
    response = client.get(reverse("admin:couponcenter_coupon_changelist"))
    assert response.status_code == 302


def test_the_coupon_page_links_its_claims(admin_client_):
    coupon = CouponFactory(claim_opens_at=timezone.now() - timedelta(minutes=1), total_stock=10)
    other = CouponFactory(claim_opens_at=timezone.now() - timedelta(minutes=1), total_stock=10)
    claims = [services.coupon_claim(coupon_id=coupon.pk, user_id=u) for u in (11, 12, 13)]
    services.coupon_claim(coupon_id=other.pk, user_id=11)
    UserCoupon.objects.filter(pk=claims[0].pk).update(
        status=UserCoupon.Status.USED, used_at=timezone.now()
    )
    page = admin_client_.get(reverse("admin:couponcenter_coupon_change", args=[coupon.pk]))
    html = page.content.decode()
    link = re.search(r'<a id="coupon-claims" href="([^"]+)">3</a>', html)
    assert link, html
    listed = admin_client_.get(link.group(1).replace("&amp;", "&"))
    assert listed.status_code == 200
    ids = {row.pk for row in listed.context["cl"].result_list}
    assert ids == {c.pk for c in claims}  # this coupon's, not the other's
    used = re.search(r'<a id="coupon-redeemed" href="([^"]+)">1</a>', html).group(1)
    listed = admin_client_.get(used.replace("&amp;", "&"))
    assert [row.pk for row in listed.context["cl"].result_list] == [claims[0].pk]
