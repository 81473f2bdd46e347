"""The console overview page (``/admin/console/``): a view over ``overview.overview()``.

Staff only (``admin_view``). The page refreshes itself every ``REFRESH_S`` seconds.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path

from couponcenter.ops import charts, overview

REFRESH_S = 5


def overview_view(request: HttpRequest) -> HttpResponse:
    data = overview.overview()
    chart_rows = [
        {
            "topic": topic,
            "counts": charts.line_chart(rows, charts.COUNT_LINES, title=f"{topic}: per minute"),
            "lateness": charts.line_chart(
                rows, charts.LATENESS_LINES, title=f"{topic}: lateness", unit="ms"
            ),
            "totals": {k: sum(r.get(k, 0) for r in rows) for k in (*charts.COUNTED, "orphaned")},
        }
        for topic, rows in data["series"].items()
    ]
    context = {
        **admin.site.each_context(request),
        "title": "Operations console",
        "refresh_s": REFRESH_S,
        "recent_minutes": overview.RECENT_MINUTES,
        "charts": chart_rows,
        **data,
    }
    return TemplateResponse(request, "admin/ops/console.html", context)


def console_urls() -> list:
    """Mounted at ``admin/console/`` by the project's urls, ahead of the admin site."""
    return [path("", admin.site.admin_view(overview_view), name="ops-console")]
