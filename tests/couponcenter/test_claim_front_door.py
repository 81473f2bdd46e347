"""The claim's front door (``couponcenter/coupons/api/front_door.py``) answers as Django's whole
stack does.

Each request is a WSGI call, as gunicorn makes it, against real PostgreSQL and Redis: once to the
project's application (the door in front of Django) and once to Django's own handler, with the
same state. Status, body and every header must be the same; the door's side of each pair must not
have reached Django , or must have, where the door is meant to step aside.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from django.test import RequestFactory, override_settings
from django.utils import timezone

from couponcenter.core import tracing
from couponcenter.coupons import claiming
from couponcenter.coupons.api.front_door import MIDDLEWARE, ClaimFrontDoor
from tests.support.factories import CouponFactory, api_user

pytestmark = pytest.mark.django_db

# What differs between two claims of the same coupon by two users.
PER_CLAIM = ("id", "user_id", "claimed_at", "expires_at")


class Recorder:
    """Django's handler, counting the requests that reach it."""

    def __init__(self) -> None:
        self.django = WSGIHandler()
        self.calls = 0

    def __call__(self, environ, start_response):
        self.calls += 1
        return self.django(environ, start_response)


@pytest.fixture(autouse=True)
def connections_kept():
    """As Django's test client keeps them: each request's ``close_old_connections`` would close
    the connection holding the test's transaction."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def django_app() -> Recorder:
    return Recorder()


@pytest.fixture
def door(django_app) -> ClaimFrontDoor:
    return ClaimFrontDoor(django_app)


@pytest.fixture
def token() -> str:
    return api_user(perms=["couponcenter.act_for_any_user"])[1]


def environ(
    user_id: int, body: str, *, token: str, content_type: str = "application/json", **extra
) -> dict:
    request = RequestFactory().generic(
        "POST",
        f"/api/users/{user_id}/coupons/",
        body,
        content_type=content_type,
        HTTP_AUTHORIZATION=f"Token {token}",
        **extra,
    )
    return request.environ


def call(app, env: dict) -> tuple[int, dict[str, str], bytes]:
    """The app's answer as a server sees it, the answer closed afterwards as a server does."""
    started: list = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        started.append((int(status.split()[0]), headers))

    answer = app(env, start_response)
    try:
        body = b"".join(answer)
    finally:
        answer.close()
    status, headers = started[0]
    names = [name.lower() for name, _ in headers]
    assert len(names) == len(set(names)), f"a header given twice: {headers}"
    return status, dict(headers), body


def both(door, django_app, user_ids: tuple[int, int], body: str, **kw) -> tuple[tuple, tuple, bool]:
    """The door's answer (for the first user), Django's (for the second), and whether the door's
    request reached Django."""
    before = django_app.calls
    through_door = call(door, environ(user_ids[0], body, **kw))
    reached = django_app.calls > before
    return through_door, call(django_app.django, environ(user_ids[1], body, **kw)), reached


def same(door_answer: tuple, django_answer: tuple, *, ignore: tuple = ()) -> None:
    (status, headers, body), (status_d, headers_d, body_d) = door_answer, django_answer
    assert status == status_d
    data, data_d = json.loads(body), json.loads(body_d)
    for key in ignore:
        assert (key in data) == (key in data_d)
        data.pop(key, None), data_d.pop(key, None)
    assert data == data_d
    # Content-Length follows the body, whose ids and times differ between the two claims.
    assert int(headers.pop("Content-Length")) == len(body)
    assert int(headers_d.pop("Content-Length")) == len(body_d)
    assert headers == headers_d


def test_the_door_answers_a_claim_as_django_does(door, django_app, token):
    coupon = CouponFactory(valid_for=timedelta(days=3))
    body = json.dumps({"coupon": coupon.pk})
    through_door, django, reached = both(door, django_app, (1, 2), body, token=token)
    assert not reached
    assert through_door[0] == 201
    same(through_door, django, ignore=PER_CLAIM)
    # The headers Django's middleware adds are there, not only equal.
    headers = through_door[1]
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert coupon.claims.filter(user_id__in=(1, 2)).count() == 2


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: CouponFactory(total_stock=1), id="sold_out"),
        pytest.param(
            lambda: CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1)),
            id="not_open",
        ),
    ],
)
def test_the_door_refuses_as_django_does(door, django_app, token, make):
    coupon = make()
    body = json.dumps({"coupon": coupon.pk})
    call(django_app.django, environ(7, body, token=token))  # the one unit, or a refusal
    through_door, django, reached = both(door, django_app, (1, 1), body, token=token)
    assert not reached
    assert through_door[0] == 409
    same(through_door, django)


def test_the_door_answers_an_unknown_coupon_as_django_does(door, django_app, token):
    through_door, django, reached = both(
        door, django_app, (1, 1), '{"coupon": 999999999}', token=token
    )
    assert not reached
    assert through_door[0] == 404
    same(through_door, django)


def test_a_retry_with_its_key_gets_the_first_answer_through_the_door(door, django_app, token):
    coupon = CouponFactory(per_user_limit=3)
    body = json.dumps({"coupon": coupon.pk})
    first = call(door, environ(1, body, token=token, HTTP_IDEMPOTENCY_KEY="order-1"))
    again = call(door, environ(1, body, token=token, HTTP_IDEMPOTENCY_KEY="order-1"))
    assert django_app.calls == 0
    assert first[0] == again[0] == 201
    assert json.loads(again[2]) == json.loads(first[2])
    assert again[1]["Idempotent-Replayed"] == "true"
    assert coupon.claims.filter(user_id=1).count() == 1


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        ('{"coupon": true}', "application/json", 400),  # read by the lean path, then by DRF
        ("{", "application/json", 400),
        ('{"coupon": "1"}', "application/json", 201),  # DRF's field coerces it
        ('{"coupon": 1}', "text/plain", 415),  # not read by the lean path
    ],
)
def test_a_claim_the_lean_path_declines_reaches_django_whole(
    door, django_app, token, body, content_type, status
):
    coupon = CouponFactory(valid_for=timedelta(days=3))
    body = body.replace('"1"', f'"{coupon.pk}"')
    through_door, django, reached = both(door, django_app, (1, 2), body, token=token,
                                content_type=content_type)  # fmt: skip
    assert reached
    assert through_door[0] == status
    same(through_door, django, ignore=PER_CLAIM)


def test_a_host_not_allowed_is_djangos_to_refuse(door, django_app, token):
    coupon = CouponFactory()
    body = json.dumps({"coupon": coupon.pk})
    through_door, django, reached = both(door, django_app, (1, 2), body, token=token,
                                HTTP_HOST="evil.example")  # fmt: skip
    assert reached
    assert through_door[0] == django[0] == 400
    assert not coupon.claims.exists()


def test_an_https_redirect_is_djangos(token):
    coupon = CouponFactory()
    body = json.dumps({"coupon": coupon.pk})
    with override_settings(SECURE_SSL_REDIRECT=True):
        # Both built with the settings, as a process builds them once (Django its middleware).
        django_app = Recorder()
        door = ClaimFrontDoor(django_app)
        status, headers, _ = call(door, environ(1, body, token=token))
    assert django_app.calls == 1
    assert status == 301
    assert headers["Location"].startswith("https://")
    assert not coupon.claims.exists()


def test_an_error_in_the_claim_is_answered_as_django_answers_it(
    door, django_app, token, monkeypatch
):
    def broken(**kwargs):
        raise RuntimeError("the claim broke")

    monkeypatch.setattr(claiming, "coupon_claim_gated", broken)
    coupon = CouponFactory()
    body = json.dumps({"coupon": coupon.pk})
    through_door, django, reached = both(door, django_app, (1, 2), body, token=token)
    assert not reached
    assert through_door[0] == django[0] == 500
    assert json.loads(through_door[2]) == json.loads(django[2])


def test_each_request_through_the_door_starts_and_finishes_as_djangos(door, token):
    """``request_started`` and ``request_finished`` (the connections' upkeep) once each, the
    finish when the server closes the answer."""
    seen: list[str] = []

    def started(**kwargs) -> None:
        seen.append("started")

    def finished(**kwargs) -> None:
        seen.append("finished")

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        coupon = CouponFactory()
        answer = door(environ(1, json.dumps({"coupon": coupon.pk}), token=token), lambda *a: None)
        assert seen == ["started"]
        answer.close()
        assert seen == ["started", "finished"]
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)


def test_the_door_stays_shut_for_another_middleware_list(door, django_app, token):
    coupon = CouponFactory()
    body = json.dumps({"coupon": coupon.pk})
    with override_settings(MIDDLEWARE=[*MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]):
        status, _, _ = call(door, environ(1, body, token=token))
    assert status == 201
    assert django_app.calls == 1
    status, _, _ = call(door, environ(2, body, token=token))
    assert status == 201
    assert django_app.calls == 1  # the usual list: the door takes it


def test_the_door_stays_shut_while_tracing_is_installed(door, django_app, token, monkeypatch):
    monkeypatch.setattr(tracing, "_installed", True)
    coupon = CouponFactory()
    status, _, _ = call(door, environ(1, json.dumps({"coupon": coupon.pk}), token=token))
    assert status == 201
    assert django_app.calls == 1


def test_the_door_is_the_projects_application():
    from couponcenter import wsgi

    assert isinstance(wsgi.application, ClaimFrontDoor)
    assert wsgi.application.open()
