"""The console's pages: the overview (``/admin/console/``, a view over ``overview.overview()``),
a queue's page, and the retention page (``retention_page``).

Staff only (``admin_view``). The page keeps itself current without reloading: every
``REFRESH_S`` seconds its script fetches ``?partial=1`` (the live part alone) and swaps it in.
``?range=5m|1h|24h`` picks the charts' range.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import path, reverse

from couponcenter.ops import charts, overview, queue_page, retention_page

REFRESH_S = 5


def overview_view(request: HttpRequest) -> HttpResponse:
    chart_range = request.GET.get("range") or overview.DEFAULT_RANGE
    if chart_range not in overview.RANGES:
        return HttpResponseBadRequest(
            f"range must be one of {', '.join(overview.RANGES)}", content_type="text/plain"
        )
    data = overview.overview(chart_range)
    per = _per(data["chart_step_s"])
    chart_rows = [
        {
            "topic": topic,
            **_charts(topic, rows, data["chart_step_s"]),
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


def _per(step_s: int) -> str:
    return "minute" if step_s == 60 else "hour"


def _charts(topic: str, rows: list[dict], step_s: int, *, backlog: bool = False) -> dict:
    """A topic's count and lateness charts (and its backlog chart, on its queue page)."""
    per = _per(step_s)
    stamp = "%H:%M" if per == "minute" else "%d %H:00"
    out = {
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
    }
    if backlog:
        out["backlog"] = charts.line_chart(
            rows,
            charts.BACKLOG_LINES,
            title=f"{topic}: backlog, sampled each {per}",
            stamp_format=stamp,
        )
    return out


def queue_view(request: HttpRequest, topic: str) -> HttpResponse:
    chart_range = request.GET.get("range") or overview.DEFAULT_RANGE
    if chart_range not in overview.RANGES:
        return HttpResponseBadRequest(
            f"range must be one of {', '.join(overview.RANGES)}", content_type="text/plain"
        )
    f = queue_page.JobFilter.from_query(request.GET)
    data = queue_page.queue_page(topic, chart_range, f)
    if data is None:
        raise Http404(f"No queue serves the topic {topic!r}.")
    jobs_url = reverse("admin:reminders_timeoutjob_changelist")
    context = {
        **admin.site.each_context(request),
        "title": f"Queue {topic}",
        "ranges": list(overview.RANGES),
        "chart_range": chart_range,
        "per": _per(data["step_s"]),
        "recent_minutes": overview.RECENT_MINUTES,
        "charts": _charts(topic, data["rows"], data["step_s"], backlog=True),
        "filters": f,
        "statuses": list(queue_page.STATUSES),
        "action_url": f"{jobs_url}?{urlencode(f.admin_query(topic))}",
        "prev_query": _query(f, chart_range, f.page - 1) if f.page > 0 else None,
        "next_query": _query(f, chart_range, f.page + 1) if data["has_more"] else None,
        **data,
    }
    return TemplateResponse(request, "admin/ops/queue.html", context)


def _query(f: queue_page.JobFilter, chart_range: str, page: int) -> str:
    pairs = {"status": f.status, "q": f.q, "range": chart_range, "p": page or ""}
    return urlencode({k: v for k, v in pairs.items() if v not in ("", None)})


def retention_view(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Retention",
        **retention_page.retention_page(),
    }
    return TemplateResponse(request, "admin/ops/retention.html", context)


def console_urls() -> list:
    """Mounted at ``admin/console/`` by the project's urls, ahead of the admin site."""
    return [
        path("", admin.site.admin_view(overview_view), name="ops-console"),
        path("queue/<str:topic>/", admin.site.admin_view(queue_view), name="ops-queue"),
        path("retention/", admin.site.admin_view(retention_view), name="ops-retention"),
    ]
