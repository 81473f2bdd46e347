"""The console overview page (``/admin/console/``): a view over ``overview.overview()``.

Staff only (``admin_view``). The page keeps itself current without reloading: every
``REFRESH_S`` seconds its script fetches ``?partial=1`` (the live part alone) and swaps it in.
``?range=5m|1h|24h`` picks the charts' range.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import path

from couponcenter.ops import charts, overview

REFRESH_S = 5


def overview_view(request: HttpRequest) -> HttpResponse:
    chart_range = request.GET.get("range") or overview.DEFAULT_RANGE
    if chart_range not in overview.RANGES:
        return HttpResponseBadRequest(
            f"range must be one of {', '.join(overview.RANGES)}", content_type="text/plain"
        )
    data = overview.overview(chart_range)
    per = "minute" if data["chart_step_s"] == 60 else "hour"
    stamp = "%H:%M" if per == "minute" else "%d %H:00"
    chart_rows = [
        {
            "topic": topic,
            "counts": charts.line_chart(
                rows,
                charts.COUNT_LINES,
                title=f"{topic}: per {per}",
                stamp_format=stamp,
                under_first=True,
            ),
            "lateness": charts.line_chart(
                rows,
                charts.LATENESS_LINES,
                title=f"{topic}: lateness p50 and p99 per {per}",
                durations=True,
                stamp_format=stamp,
            ),
            "totals": {
                k: sum(r.get(k, 0) for r in rows)
                for k in (*charts.COUNTED, "orphaned", "capped", "digested")
            },
        }
        for topic, rows in data["series"].items()
    ]
    context = {
        **admin.site.each_context(request),
        "title": "Operations console",
        "refresh_s": REFRESH_S,
        "recent_minutes": overview.RECENT_MINUTES,
        "ranges": list(overview.RANGES),
        "range_label": {"5m": "last 5 minutes", "1h": "last hour", "24h": "last 24 hours"}[
            chart_range
        ],
        "per": per,
        "charts": chart_rows,
        **data,
    }
    template = (
        "admin/ops/console_live.html" if request.GET.get("partial") else ("admin/ops/console.html")
    )
    return TemplateResponse(request, template, context)


def console_urls() -> list:
    """Mounted at ``admin/console/`` by the project's urls, ahead of the admin site."""
    return [path("", admin.site.admin_view(overview_view), name="ops-console")]
