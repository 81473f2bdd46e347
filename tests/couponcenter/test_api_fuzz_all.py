"""Schemathesis over the whole ``/api/schema/`` as staff: no 5xx, every response fits the schema.

Staff may call every operation, so every handler is reached. Ids exist before the run (a coupon,
a claim, a subscription, a timeout job), and the generated path ids are pinned to them half of
the time so that the 2xx paths are exercised, not only the 404s. The token endpoint is left out
(throttled; see test_permissions). In-process through the WSGI app, against the real database and
Redis, under this test's Redis key prefix.
"""

from __future__ import annotations

import zlib
from datetime import timedelta

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from couponcenter.coupons import services
from reminders.services import subscription_subscribe, timeout_job_create
from tests.support.factories import CouponFactory, api_user

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
# Valid requests only: the schema-conformance checks judge what a correct client can get back
# (test_api_fuzz covers invalid input to the coupon and claim endpoints).
schema.config.generation.update(modes=["positive"])
operations = schema.exclude(path="/api/auth/token/")

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

USER = 4242
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


# Operations whose answers do not match their documented schema yet (found by this test; no 5xx
# among them). They are still fuzzed for server errors; the schema checks come back as each row
# is fixed and removed. Any other operation, including every new one, gets every check.
_UNDOCUMENTED_404 = "a 404 (unknown id or user) is not in the documented responses"
KNOWN_SCHEMA_GAPS = {
    ("POST", "/api/ops/dead-letters/requeue/"): "an oversized form body gets Django's HTML 400",
}


@pytest.fixture(autouse=True)
def keep_the_test_connection():
    """Like Django's test client: a request must not close the test's database connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def known(db) -> dict[str, int]:
    soon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1))
    open_now = CouponFactory()
    claim = services.coupon_claim(coupon_id=open_now.pk, user_id=USER)
    subscription_subscribe(user_id=USER, coupon=soon)
    job = timeout_job_create(topic="timeout.default", biz_type="order", biz_id="F-1",
                             action_time=timezone.now() + timedelta(hours=1))  # fmt: skip
    return {"user_id": USER, "coupon_id": soon.pk, "user_coupon_id": claim.pk, "job_id": job.pk}


@pytest.fixture
def headers(db) -> dict[str, str]:
    _, token = api_user(staff=True)
    return {"Authorization": f"Token {token}"}


@operations.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_5xx_and_every_response_fits_the_schema(case, headers, known):
    # Half of the cases (decided by the generated body, so a failure replays the same way) hit
    # the ids that exist.
    if zlib.crc32(repr(case.body).encode()) % 2 == 0:
        for name in list(case.path_parameters or {}):
            if name in known:
                case.path_parameters[name] = known[name]
    gap = KNOWN_SCHEMA_GAPS.get((case.method.upper(), case.path))
    case.call_and_validate(headers=headers, checks=[not_a_server_error] if gap else CHECKS)
