"""Every operation of the OpenAPI schema x every kind of caller: who gets in, who is refused.

The operations come from the generated schema, so a new endpoint fails
``test_every_operation_is_in_the_table`` until its row is written here. A cell says what the
caller must get: ``401`` (not authenticated), ``403`` (authenticated, not allowed) or ``OK``
(past authentication and permissions: a 2xx, or a 400/404/409 about the request itself; never a
401, a 403 or a 5xx). Requests carry an empty JSON body, so ``OK`` is often a 400: the point is
that the permission check let the caller through.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from couponcenter.coupons import services
from reminders.models import Notification, TimeoutTopic
from reminders.services import timeout_job_create, timeout_topic_save
from tests.couponcenter.conftest import client_with
from tests.support.factories import CouponFactory, api_user

pytestmark = pytest.mark.django_db

ME, OTHER = 601, 602
OK, NO_AUTH, DENIED = "OK", 401, 403

ROLES = ("anonymous", "linked_own", "linked_other", "service", "manager", "bare_staff",
         "staff_viewer", "staff")  # fmt: skip

# Rows: (method, path template) -> cells in the order of ROLES.
# linked_own / linked_other: an account linked to end user ME, acting for ME / for OTHER (the
# two differ only where the path names a user); service: act_for_any_user; manager:
# manage_coupons; bare_staff: is_staff and no permission; staff_viewer: is_staff and the view_
# permissions of the project's apps; staff: is_staff and every permission of the project's apps.
# Being staff grants nothing by itself: each staff endpoint checks the model permission of what
# it reads (view_) or writes (add_, change_, delete_, or the API's own permission).
ANYONE = (OK,) * 8
SIGNED_IN = (NO_AUTH, OK, OK, OK, OK, OK, OK, OK)
MANAGERS = (NO_AUTH, DENIED, DENIED, DENIED, OK, DENIED, DENIED, OK)
STAFF_READS = (NO_AUTH, DENIED, DENIED, DENIED, DENIED, DENIED, OK, OK)
STAFF_WRITES = (NO_AUTH, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, OK)
FOR_THE_USER = (NO_AUTH, OK, DENIED, OK, DENIED, DENIED, DENIED, OK)

TABLE: dict[tuple[str, str], tuple] = {
    ("POST", "/api/auth/token/"): ANYONE,
    ("POST", "/api/auth/token/revoke/"): SIGNED_IN,
    ("GET", "/api/coupons/"): SIGNED_IN,
    ("POST", "/api/coupons/"): MANAGERS,
    ("GET", "/api/coupons/{coupon_id}/"): SIGNED_IN,
    ("PATCH", "/api/coupons/{coupon_id}/"): MANAGERS,
    ("POST", "/api/coupons/{coupon_id}/cancel/"): MANAGERS,
    ("GET", "/api/ops/backlog/"): STAFF_READS,
    ("GET", "/api/ops/config/"): STAFF_READS,
    ("PATCH", "/api/ops/config/"): STAFF_WRITES,
    ("GET", "/api/ops/dead-letters/"): STAFF_READS,
    ("POST", "/api/ops/dead-letters/requeue/"): STAFF_WRITES,
    # manage_timeouts: the timeout API's own permission (reads included), held by "staff" only.
    ("GET", "/api/timeouts/"): STAFF_WRITES,
    ("POST", "/api/timeouts/"): STAFF_WRITES,
    ("POST", "/api/timeouts/bulk/"): STAFF_WRITES,
    ("GET", "/api/timeouts/by-key/"): STAFF_WRITES,
    ("DELETE", "/api/timeouts/by-key/"): STAFF_WRITES,
    ("PATCH", "/api/timeouts/by-key/"): STAFF_WRITES,
    ("GET", "/api/timeouts/{job_id}/"): STAFF_WRITES,
    ("DELETE", "/api/timeouts/{job_id}/"): STAFF_WRITES,
    ("POST", "/api/timeouts/{job_id}/end/"): STAFF_WRITES,  # change_timeoutjob
    ("POST", "/api/accounts/"): STAFF_WRITES,
    ("POST", "/api/accounts/token/revoke/"): STAFF_WRITES,
    ("GET", "/api/timeout-topics/"): STAFF_READS,
    ("POST", "/api/timeout-topics/"): STAFF_WRITES,
    ("GET", "/api/timeout-topics/{name}/"): STAFF_READS,
    ("PATCH", "/api/timeout-topics/{name}/"): STAFF_WRITES,
    ("DELETE", "/api/timeout-topics/{name}/"): STAFF_WRITES,
    ("GET", "/api/users/{user_id}/coupons/"): FOR_THE_USER,
    ("POST", "/api/users/{user_id}/coupons/"): FOR_THE_USER,
    ("POST", "/api/users/{user_id}/coupons/{user_coupon_id}/redeem/"): FOR_THE_USER,
    ("GET", "/api/users/{user_id}/notifications/"): FOR_THE_USER,
    ("POST", "/api/users/{user_id}/notifications/read/"): FOR_THE_USER,
    ("POST", "/api/users/{user_id}/notifications/{notification_id}/read/"): FOR_THE_USER,
    ("GET", "/api/users/{user_id}/reminders/"): FOR_THE_USER,
    ("PUT", "/api/users/{user_id}/reminders/{coupon_id}/"): FOR_THE_USER,
    ("DELETE", "/api/users/{user_id}/reminders/{coupon_id}/"): FOR_THE_USER,
}


def schema_operations() -> list[tuple[str, str]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return sorted(
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    )


def test_every_operation_is_in_the_table():
    missing = set(schema_operations()) - set(TABLE)
    assert not missing, f"new endpoints: add a row to TABLE for each of {sorted(missing)}"
    assert not set(TABLE) - set(schema_operations()), "TABLE lists endpoints that are gone"


@pytest.fixture
def callers() -> dict[str, Client]:
    return {
        "anonymous": client_with(),
        # Two accounts linked to ME, not one: a caller revoking its own token must not sign the
        # next one out.
        "linked_own": client_with(api_user(end_user_id=ME)[1]),
        "linked_other": client_with(api_user(end_user_id=ME)[1]),
        "service": client_with(api_user(perms=["couponcenter.act_for_any_user"])[1]),
        "manager": client_with(api_user(perms=["couponcenter.manage_coupons"])[1]),
        "bare_staff": client_with(api_user(staff=True, staff_perms=())[1]),
        "staff_viewer": client_with(api_user(staff=True, staff_perms="view")[1]),
        "staff": client_with(api_user(staff=True)[1]),
    }


def fill(path: str, *, user_id: int, ids: dict[str, int | str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: str(user_id if m[1] == "user_id" else ids[m[1]]), path)


@pytest.mark.parametrize(("method", "path"), schema_operations())
def test_permission_matrix(callers, method, path):
    expected = dict(zip(ROLES, TABLE[(method, path)], strict=True))
    got = {}
    for role in ROLES:
        # Fresh objects per caller: an earlier caller's cancel or delete must not change the
        # next one's answer.
        coupon = CouponFactory(claim_opens_at=timezone.now() - timedelta(minutes=1))
        user_id = OTHER if role == "linked_other" else ME
        ids = {
            "coupon_id": coupon.pk,
            "user_coupon_id": services.coupon_claim(coupon_id=coupon.pk, user_id=user_id).pk,
            "job_id": timeout_job_create(
                topic="timeout.default", biz_type="order", biz_id=f"M-{role}",
                action_time=timezone.now() + timedelta(hours=1),
            ).pk,
            "name": timeout_topic_save(topic=TimeoutTopic(name=f"perm.{role}"), type="log").name,
            "notification_id": Notification.objects.create(
                user_id=user_id, dedup_key=f"perm-{role}-{coupon.pk}"
            ).pk,
        }  # fmt: skip
        response = callers[role].generic(
            method, fill(path, user_id=user_id, ids=ids), "{}", content_type="application/json"
        )
        status = response.status_code
        assert status < 500, (role, method, path, status, response.content[:300])
        got[role] = status if status in (401, 403) else OK
    assert got == expected


# --- outside the API schema ----------------------------------------------------------------------


def test_anonymous_may_read_health_schema_and_docs(anon):
    assert anon.get("/healthz/live/").status_code == 200
    health = anon.get("/healthz/")  # PostgreSQL and Redis are up in the tests: ready
    assert health.status_code == 200, health.content
    assert anon.get("/api/schema/").status_code == 200
    assert anon.get("/api/docs/").status_code == 200


def test_anonymous_may_not_scrape_metrics_or_use_the_admin():
    world = Client(REMOTE_ADDR="203.0.113.7")
    assert world.get("/metrics").status_code == 403
    response = world.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_a_session_is_refused_without_csrf(db):
    """The browsable session login must not be a way around CSRF for API writes."""
    user, _ = api_user(staff=True)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post("/api/coupons/", {}, content_type="application/json")
    assert response.status_code == 403
