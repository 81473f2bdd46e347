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
