"""Every error under ``/api/`` is JSON in the API's error shape, with ``DEBUG`` on or off.

The test walks every URL pattern under ``api/`` (so a new endpoint is covered without listing it),
puts ids that are not ids into its parameters (negative, not a number, over 18 digits, unknown
names), and calls it with every method; then unknown paths. Django's own 404 page (with ``DEBUG``
it lists every URL pattern of the project) must never come back.
"""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.support.factories import api_user

pytestmark = pytest.mark.django_db

BAD_IDS = ["-1", "abc", "9" * 19, "1.5", "%20"]
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
PARAM = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")


def _api_routes(patterns=None, prefix: str = "") -> list[str]:
    """Every route (Django ``path()`` syntax) under ``api/``, the catch-all excepted."""
    routes = []
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            routes += _api_routes(entry.url_patterns, route)
        elif isinstance(entry, URLPattern) and route.startswith("api/") and "^" not in route:
            routes.append(route)
    return routes


def _bad_paths(route: str) -> list[str]:
    """The route with each of its parameters, in turn, given a value that names nothing."""
    params = list(PARAM.finditer(route))
    paths = []
    for target in params:
        values = BAD_IDS if target["converter"] == "id" else ["no-such-thing-here"]
        for value in values:
            path = route
            for param in params:  # the others get a plausible value
                fill = value if param is target else "1"
                path = path.replace(param.group(0), fill, 1)
            paths.append("/" + path)
    return paths


ROUTES = _api_routes()
BAD = sorted({path for route in ROUTES for path in _bad_paths(route)})
UNKNOWN = ["/api/", "/api/nope/", "/api/coupons/1/nope/", "/api/ops/", "/api/" + "x" * 300 + "/"]


def test_the_walk_sees_the_api():
    """The walk itself: it finds the endpoints, and the parameterised ones give bad paths."""
    assert "api/coupons/<id:coupon_id>/" in ROUTES
    assert "api/timeouts/by-key/" in ROUTES
    assert "/api/coupons/-1/" in BAD and "/api/timeout-topics/no-such-thing-here/" in BAD
    assert len(BAD) >= 40


@pytest.fixture(params=[False, True], ids=["debug-off", "debug-on"])
def staff(request, settings, client):
    settings.DEBUG = request.param
    _, token = api_user(staff=True)
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {token}"
    return client


def _assert_json_error(response, path: str, method: str) -> dict:
    where = f"{method} {path} -> {response.status_code}"
    assert response.status_code >= 400, where
    assert response["Content-Type"].startswith("application/json"), (where, response.content[:200])
    body = response.json()
    assert isinstance(body, dict) and ("detail" in body or "errors" in body), (where, body)
    assert b"urlpatterns" not in response.content and b"<html" not in response.content.lower()
    return body


@pytest.mark.parametrize("method", METHODS)
def test_bad_ids_get_json_404s(staff, method):
    for path in BAD:
        response = staff.generic(method, path, b"{}", content_type="application/json")
        _assert_json_error(response, path, method)
        assert response.status_code in (404, 405), (method, path, response.status_code)


@pytest.mark.parametrize("method", METHODS)
def test_unknown_paths_get_json_404s(staff, method):
    for path in UNKNOWN:
        response = staff.generic(method, path, b"{}", content_type="application/json")
        body = _assert_json_error(response, path, method)
        assert response.status_code == 404
        assert body == {"detail": "Not found."}


def test_a_missing_trailing_slash_says_so_and_does_not_redirect(staff):
    response = staff.post("/api/coupons", data=b"{}", content_type="application/json")
    assert response.status_code == 404
    assert response.json() == {
        "detail": "Not found. Did you mean /api/coupons/ (with the trailing slash)?"
    }


def test_without_a_token_an_unknown_path_is_still_json(client):
    response = client.get("/api/nope/")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


def test_pages_outside_the_api_keep_their_html_404(client):
    response = client.get("/nope/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


def test_form_bodies_are_415_in_the_error_shape(staff):
    """The API reads JSON only (form and multipart bodies broke generated clients)."""
    response = staff.post("/api/coupons/", data={"name": "x"})  # Django's multipart default
    assert response.status_code == 415
    assert "detail" in response.json()
