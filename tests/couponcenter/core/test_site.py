"""The landing page at ``/`` (where the admin's "View site" goes), the favicon and the admin's
branding."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_the_landing_page_links_what_runs_here(client):
    response = client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    for href in ("/admin/console/", "/admin/", "/api/docs/", "/healthz/", "/api/schema/"):
        assert f'href="{href}"' in page or href in page, href
    assert 'rel="icon"' in page


def test_the_favicon_is_served_and_cached(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/svg+xml"
    assert response.content.startswith(b"<svg") and "max-age=86400" in response["Cache-Control"]
    assert client.post("/favicon.ico").status_code == 405


def test_the_admin_is_branded_and_view_site_lands_on_the_landing_page(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert "<title>Operations and data | Coupon Center admin</title>" in page
    assert ">Coupon Center</a>" in page
    assert 'href="/"' in page  # "View site"
    assert '<link rel="icon" href="/favicon.ico"' in page
