import re

import pytest

from tests.support.factories import api_user

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path", ["/api/coupons/", "/api/users/5/coupons/", "/api/timeouts/"], ids=str
)
def test_deeply_nested_json_is_a_400_not_a_500(client, path):
    _, token = api_user(staff=True)
    body = "[" * 100_000 + "]" * 100_000
    response = client.post(
        path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
    )
    assert response.status_code == 400
    assert "nested too deeply" in str(response.json()["errors"])


def _schema_writes() -> list[tuple[str, str]]:
    """Every (method, path) of the OpenAPI schema that takes a body, ids filled in."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    out = []
    for path, operations in schema["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "1", path)
        out += [(m, concrete) for m in operations if m in {"post", "put", "patch"}]
    return sorted(out)


def test_every_url_that_takes_a_body_answers_deep_nesting_with_a_400(client):
    """Every view uses the project's parsers (ObtainAuthToken sets its own and bypassed them)."""
    _, token = api_user(staff=True)
    body = "[" * 200_000 + "]" * 200_000
    writes = _schema_writes()
    assert ("post", "/api/auth/token/") in writes and len(writes) > 5
    for method, path in writes:
        for auth in ({}, {"HTTP_AUTHORIZATION": f"Token {token}"}):
            response = getattr(client, method)(path, body, content_type="application/json", **auth)
            assert response.status_code < 500, (method, path, response.status_code)
