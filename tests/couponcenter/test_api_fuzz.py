"""Property-based fuzzing of the coupon API from its own OpenAPI schema: no input is a 500.

Schemathesis generates valid and invalid requests for every coupon and claim operation and sends
them in-process through the WSGI app, as a service account that may also manage coupons. (The
token endpoint is left out: it is throttled, and covered in test_permissions.)
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.support.factories import CouponFactory, api_user

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
coupon_operations = schema.include(path_regex=r"^/api/(coupons|users/\{user_id\}/coupons)")

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def keep_the_test_connection():
    """Like Django's test client: a request must not close the test's database connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def headers(db) -> dict[str, str]:
    CouponFactory.create_batch(2)
    _, token = api_user(perms=["couponcenter.act_for_any_user", "couponcenter.manage_coupons"])
    return {"Authorization": f"Token {token}"}


@coupon_operations.parametrize()
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_input_is_a_server_error(case, headers):
    case.call_and_validate(headers=headers, checks=[not_a_server_error])
