"""A body over the size limit on the API is a 413 in the API's JSON error shape, logged as a
warning without a traceback (issue 13, item 9), with DEBUG on (``make run``) as with it off."""

from __future__ import annotations

import json
import logging

import pytest

from tests.support.factories import api_user

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("path", ["/api/coupons/", "/api/users/5/coupons/", "/api/auth/token/"])
def test_a_body_over_the_limit_is_a_json_413(client, settings, caplog, path, debug):
    settings.DEBUG = debug
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    _, token = api_user(staff=True)
    body = json.dumps({"name": "x" * 20_000})
    with caplog.at_level(logging.INFO):
        response = client.post(path, body, content_type="application/json",
                               HTTP_AUTHORIZATION=f"Token {token}")  # fmt: skip
    assert response.status_code == 413
    assert response["Content-Type"].startswith("application/json")
    assert "too large" in str(response.json()["errors"]).lower()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]
