"""Run by tests/couponcenter/core/test_tracing.py in its own process (instrumentation is
process-wide and stays): tracing on with the SDK's in-memory exporter, then a reminder and a
timeout scheduled over the API and delivered or fired by the real worker code (Celery eager).
Prints every finished span as one JSON list."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "couponcenter.settings")
django.setup()

from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from couponcenter.core import tracing  # noqa: E402

exporter = InMemorySpanExporter()
assert tracing.setup(exporter=exporter)

from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from couponcenter.celery import app as celery_app  # noqa: E402
from couponcenter.coupons import services as coupon_services  # noqa: E402
from reminders.members import REMINDER_TOPIC  # noqa: E402
from reminders.runtime.worker import build_worker  # noqa: E402
from tests.support.factories import api_user  # noqa: E402


def drain(topic: str) -> None:
    worker = build_worker([topic])
    try:
        worker.run_until_idle()
    finally:
        worker.shutdown()


def main() -> None:
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    _, token = api_user(staff=True)
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    coupon = coupon_services.coupon_create(
        name="Traced", claim_opens_at=timezone.now() + timedelta(seconds=30), total_stock=10,
        valid_for=timedelta(days=1),
    )  # fmt: skip
    subscribed = client.put(f"/api/users/7/reminders/{coupon.pk}/")
    assert subscribed.status_code == 201, subscribed.content
    drain(REMINDER_TOPIC)
    created = client.post("/api/timeouts/", {
        "topic": "timeout.default", "biz_type": "order", "biz_id": "T-1",
        "action_time": timezone.now().isoformat()}, content_type="application/json")  # fmt: skip
    assert created.status_code == 201, created.content
    drain("timeout.default")
    spans = [
        {
            "name": s.name,
            "kind": s.kind.name,
            "trace_id": f"{s.context.trace_id:032x}",
            "span_id": f"{s.context.span_id:016x}",
            "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
            "start": s.start_time,
            "end": s.end_time,
            "attributes": {k: v for k, v in s.attributes.items()},
            "links": [f"{link.context.span_id:016x}" for link in s.links],
        }
        for s in exporter.get_finished_spans()
    ]
    out = {"spans": spans, "coupon_opens": coupon.claim_opens_at.isoformat(),
           "reminder_lead_s": coupon.reminder_lead.total_seconds()}  # fmt: skip
    sys.stdout.write("SPANS " + json.dumps(out, default=str) + "\n")


if __name__ == "__main__":
    main()
