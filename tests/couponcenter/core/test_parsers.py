import json
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


def _writes_with_surrogates() -> list[tuple[str, str, str]]:
    """Every (method, path, body) of the schema that takes a body: the body has each field of the
    operation's request, every string (keys too) holding a lone surrogate, as JSON text
    (``"\\ud800"`` is valid JSON, but no valid Unicode)."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    out = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if method not in {"post", "put", "patch"}:
                continue
            content = operation.get("requestBody", {}).get("content", {})
            ref = content.get("application/json", {}).get("schema", {}).get("$ref", "")
            fields = schema["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
            body = {key: "x\ud800" for key in fields.get("properties", {})}
            body["odd\udfff"] = "x"
            out.append((method, re.sub(r"\{[^}]+\}", "1", path), json.dumps(body)))
    return sorted(out)


def test_every_url_that_takes_a_body_answers_a_lone_surrogate_with_a_400(client):
    """Every string of every body, keys included, whatever the field: refused by the parser before
    any view or serializer sees it (a serializer echoing it back, a JSON column storing it, a
    log line printing it all fail on a lone surrogate)."""
    parsed = 0
    for method, path, body in _writes_with_surrogates():
        _, token = api_user(staff=True)  # each its own: one of the calls revokes its token
        response = getattr(client, method)(
            path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
        )
        assert response.status_code < 500, (method, path, response.status_code)
        if response.status_code == 400:
            parsed += "not valid Unicode: a lone surrogate" in str(response.json())
    assert parsed >= 8


def test_the_message_names_where_the_lone_surrogate_is(client):
    _, token = api_user(staff=True)
    body = '{"jobs": [{"topic": "t"}, {"attribute": {"ok": ["fine", {"x\\udfff": 1}]}}]}'
    response = client.post("/api/timeouts/bulk/", body, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Token {token}")  # fmt: skip
    assert response.status_code == 400
    assert response.json() == {"errors": {"non_field_errors": [
        "JSON parse error - not valid Unicode: a lone surrogate U+DFFF in the key "
        "jobs.1.attribute.ok.1.x\\udfff."
    ]}}  # fmt: skip


def test_a_surrogate_pair_and_an_escaped_backslash_are_valid(client):
    """``"\\ud83d\\ude00"`` is one character (U+1F600); ``"\\\\ud800"`` is a backslash and text."""
    _, token = api_user(staff=True)
    body = '{"name": "\\ud83d\\ude00 \\\\ud800"}'
    response = client.post("/api/coupons/", body, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Token {token}")  # fmt: skip
    assert "not valid Unicode" not in str(response.json())


def test_a_body_in_another_charset_is_checked_too(client):
    _, token = api_user(staff=True)
    body = '{"name": "x\\ud800"}'  # sent as UTF-16 by the client
    response = client.post("/api/coupons/", body, content_type="application/json; charset=utf-16",
                           HTTP_AUTHORIZATION=f"Token {token}")  # fmt: skip
    assert response.status_code == 400
    assert "not valid Unicode: a lone surrogate U+D800 in name" in str(response.json())


def test_every_url_that_takes_a_body_answers_a_body_nested_past_the_bound_with_a_400(client):
    """Nested deeper than the parser's bound but well within what ``json`` parses: every field of
    every body a list 600 deep. No view or serializer gets to walk it recursively (Django's
    lookups recurse per level of a list given as a related object's key)."""
    deep = "[" * 600 + "1" + "]" * 600
    for method, path, body in _writes_with_surrogates():
        fields = [name for name in json.loads(body) if not name.startswith("odd")]
        text = "{" + ",".join(f'"{name}": {deep}' for name in fields) + "}"
        _, token = api_user(staff=True)  # each its own: one of the calls revokes its token
        response = getattr(client, method)(
            path, text, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
        )
        assert response.status_code < 500, (method, path, response.status_code)
    _, token = api_user(staff=True)
    one = client.post(
        "/api/timeout-topics/", f'{{"owner": {deep}}}', content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {token}",
    )  # fmt: skip
    assert one.status_code == 400
    assert one.json() == {"errors": {"non_field_errors": [
        "JSON parse error - the body is nested too deeply (200 levels at most)."
    ]}}  # fmt: skip
