"""The claim's lean path (``UserCouponListApi.claim_lean``) answers exactly as DRF's path does.

Every case is sent twice against the same state: once as the lean path takes it, once with a query
string, which the lean path leaves to DRF. Status, body and headers must be the same.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.coupons import services
from couponcenter.coupons.api import claims as claims_api
from couponcenter.coupons.api.claims import UserCouponOutputSerializer, user_coupon_data
from couponcenter.coupons.models import UserCoupon
from tests.couponcenter.conftest import client_with
from tests.support.factories import CouponFactory, UserCouponFactory, api_user

pytestmark = pytest.mark.django_db

HEADERS = ("Content-Type", "Allow", "Vary", "Retry-After")


@pytest.fixture
def lean_calls(monkeypatch) -> list[bool]:
    """One entry per claim request: whether the lean path answered it."""
    calls: list[bool] = []
    original = claims_api.UserCouponListApi.claim_lean

    def spy(self, request, user_id):
        response = original(self, request, user_id)
        calls.append(response is not None)
        return response

    monkeypatch.setattr(claims_api.UserCouponListApi, "claim_lean", spy)
    return calls


def post(client, user_id: int, coupon_id: int, *, drf: bool):
    query = "?via=drf" if drf else ""
    return client.post(f"/api/users/{user_id}/coupons/{query}", {"coupon": coupon_id},
                       format="json")  # fmt: skip


def answer(response, *, ignore=()) -> tuple:
    body = {k: v for k, v in response.json().items() if k not in ignore}
    return response.status_code, body, {h: response.get(h) for h in HEADERS}


def test_the_lean_path_answers_a_claim_as_drf_does(lean_calls):
    service = client_with(api_user(perms=["couponcenter.act_for_any_user"])[1])
    coupon = CouponFactory(valid_for=timedelta(days=3))
    lean = post(service, 1, coupon.pk, drf=False)
    drf = post(service, 2, coupon.pk, drf=True)
    assert lean_calls == [True, False]
    assert lean.status_code == 201
    assert answer(lean, ignore=("id", "user_id", "claimed_at", "expires_at")) == answer(
        drf, ignore=("id", "user_id", "claimed_at", "expires_at")
    )
    made = UserCoupon.objects.get(pk=lean.json()["id"])
    assert lean.json() == UserCouponOutputSerializer(made).data
    assert lean.data == lean.json()  # the test client's ``data``, as with DRF


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: CouponFactory(total_stock=1), id="sold_out"),
        pytest.param(lambda: CouponFactory(), id="limit_reached"),
        pytest.param(
            lambda: CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1)),
            id="not_open",
        ),
        pytest.param(lambda: services.coupon_cancel(coupon=CouponFactory()), id="cancelled"),
    ],
)
def test_the_lean_path_refuses_as_drf_does(lean_calls, make):
    service = client_with(api_user(perms=["couponcenter.act_for_any_user"])[1])
    coupon = make()
    post(service, 1, coupon.pk, drf=True)  # the first claim (sold_out, limit_reached) or a 409
    lean_calls.clear()
    lean, drf = post(service, 1, coupon.pk, drf=False), post(service, 1, coupon.pk, drf=True)
    assert lean_calls == [True, False]
    assert lean.status_code == 409
    assert answer(lean) == answer(drf)


def test_a_refusal_answered_again_or_for_another_moment_is_still_drfs(lean_calls):
    """Each distinct refusal body is rendered once: the second answer comes from the cache, and a
    coupon opening at another moment gets its own body, not the first one's."""
    service = client_with(api_user(perms=["couponcenter.act_for_any_user"])[1])
    soon = timezone.now() + timedelta(hours=1)
    first, other = (
        CouponFactory(claim_opens_at=soon),
        CouponFactory(claim_opens_at=soon + timedelta(seconds=1)),
    )
    answers = [post(service, user, first.pk, drf=False) for user in (1, 2)]
    answers.append(post(service, 3, other.pk, drf=False))
    drf = [post(service, 4, coupon.pk, drf=True) for coupon in (first, other)]
    assert lean_calls == [True, True, True, False, False]
    assert answer(answers[0]) == answer(answers[1]) == answer(drf[0])
    assert answer(answers[2]) == answer(drf[1]) != answer(drf[0])
    assert answers[2].json()["opens_at"] != answers[0].json()["opens_at"]


def test_the_rendered_refusals_are_bounded_and_match_the_renderer(monkeypatch):
    monkeypatch.setattr(claims_api, "_refusals_rendered", {})
    bodies = [{"code": "not_open", "detail": f"at {n}", "opens_at": str(n)} for n in range(300)]
    for body in bodies:
        assert claims_api._refusal_rendered(body) == claims_api._json_renderer.render(body)
    assert 0 < len(claims_api._refusals_rendered) <= claims_api._REFUSALS_RENDERED_MAX
    unhashable = {"code": "refused", "detail": "x", "fields": ["a"]}
    assert claims_api._refusal_rendered(unhashable) == claims_api._json_renderer.render(unhashable)


def test_the_lean_path_answers_an_unknown_coupon_as_drf_does(lean_calls):
    service = client_with(api_user(perms=["couponcenter.act_for_any_user"])[1])
    lean, drf = post(service, 1, 999_999_999, drf=False), post(service, 1, 999_999_999, drf=True)
    assert lean_calls == [True, False]
    assert lean.status_code == 404
    assert answer(lean) == answer(drf)


@pytest.mark.parametrize(
    ("body", "content_type", "extra", "status"),
    [
        ('{"coupon": "1"}', "application/json", {}, 201),  # a string: DRF's field coerces it
        ('{"coupon": 1.0}', "application/json", {}, 201),
        ('{"coupon": true}', "application/json", {}, 400),
        ('{"coupon": 0}', "application/json", {}, 400),
        ('{"coupon": 9223372036854775808}', "application/json", {}, 400),
        ('{"coupon": NaN}', "application/json", {}, 400),
        ("[1]", "application/json", {}, 400),
        ("{", "application/json", {}, 400),
        ("\ufeff{}", "application/json", {}, 400),
        ("", "application/json", {}, 400),
        ("coupon=1", "application/x-www-form-urlencoded", {}, 415),  # the API reads JSON only
        ('{"coupon": 1}', "text/plain", {}, 415),
        ('{"coupon": 1}', "application/json", {"HTTP_ACCEPT": "text/csv"}, 406),
        ('{"coupon": 1}', "application/json", {"HTTP_AUTHORIZATION": "Token nope"}, 401),
        ('{"coupon": 1}', "application/json", {"HTTP_AUTHORIZATION": "Token a b"}, 401),
    ],
)
def test_what_the_lean_path_leaves_to_drf(lean_calls, body, content_type, extra, status):
    token = api_user(perms=["couponcenter.act_for_any_user"])[1]
    client = client_with(None if "HTTP_AUTHORIZATION" in extra else token)
    coupon = CouponFactory(pk=1) if status == 201 else CouponFactory()
    response = client.generic(
        "POST", "/api/users/7/coupons/", body.encode(), content_type=content_type, **extra
    )
    assert response.status_code == status, response.content
    assert lean_calls == [False]
    assert coupon.pk


def test_a_caller_acting_for_another_user_gets_drfs_403(lean_calls):
    coupon = CouponFactory()
    _, token = api_user(end_user_id=5)
    response = post(client_with(token), 6, coupon.pk, drf=False)
    assert response.status_code == 403
    assert response.json() == {"detail": "You may not act for this user."}
    assert lean_calls == [False]
    assert not UserCoupon.objects.exists()
    # Its own user: the lean path.
    assert post(client_with(token), 5, coupon.pk, drf=False).status_code == 201
    assert lean_calls == [False, True]


def test_the_output_is_the_serializers():
    for user_coupon in (
        UserCouponFactory(),
        UserCouponFactory(status=UserCoupon.Status.USED, used_at=timezone.now()),
    ):
        assert user_coupon_data(user_coupon) == UserCouponOutputSerializer(user_coupon).data
