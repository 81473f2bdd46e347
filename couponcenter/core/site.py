"""The site's own pages outside the API and the admin: the landing page at ``/`` and the icon."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe

# A ticket with a clock: the favicon, as SVG (every current browser takes it; no static files
# needed, so it shows under any server).
FAVICON_SVG = b"""<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64">
<path d="M6 14h52v12a6 6 0 0 0 0 12v12H6V38a6 6 0 0 0 0-12z" fill="#264b5d"/>
<circle cx="32" cy="32" r="12" fill="#f5dd5d"/>
<path d="M32 24v8l6 4" stroke="#264b5d" stroke-width="3" fill="none" stroke-linecap="round"/>
</svg>
"""


@require_safe
@cache_control(max_age=86400, public=True)
def favicon(request: HttpRequest) -> HttpResponse:
    return HttpResponse(FAVICON_SVG, content_type="image/svg+xml")


@require_safe
def home(request: HttpRequest) -> HttpResponse:
    """Where "View site" and a first visit land: what runs here and where to go."""
    return render(request, "couponcenter/home.html")
