"""OpenTelemetry: one trace from the API call that schedules a reminder or a timeout to its
delivery or firing, through the official Django, Celery, psycopg2 (or SQLite) and Redis
instrumentations. The spans come from the SDK's in-memory exporter, in a process of their own
(instrumentation is process-wide and would stay on for the rest of the suite); off by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from couponcenter.core import tracing
from couponcenter.coupons.bench.http import database_url
from reminders.services import subscription_subscribe
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans(redis_prefix, reminder_settings) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "couponcenter.settings", "DEBUG": "1",
           "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL,
           "REDIS_KEY_PREFIX": redis_prefix, "COUPONCENTER_REDIS_AUTOSTART": "0",
           "OTEL_EXPORTER_OTLP_ENDPOINT": ""}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "tests.support.trace_probe"],
                          cwd=settings.BASE_DIR, env=env, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("SPANS "))
    return json.loads(line[len("SPANS ") :])


def _one(spans: list[dict], **match) -> dict:
    found = [s for s in spans if all(s.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [s["name"] for s in spans])
    return found[0]


def test_one_trace_from_the_api_call_to_the_inbox_write(spans):
    all_spans = spans["spans"]
    route = "api/users/<id:user_id>/reminders/<id:coupon_id>/"
    put = _one(all_spans, kind="SERVER", name=f"PUT {route}")
    deliver = _one(all_spans, name="reminder.deliver")
    assert deliver["trace_id"] == put["trace_id"]  # the context travelled with the reminder
    assert deliver["parent_id"] == put["span_id"]
    assert deliver["attributes"]["couponcenter.outcome"] == "delivered"
    # It starts at the due moment: the span shows the wait past it and the delivery itself.
    opens = datetime.fromisoformat(spans["coupon_opens"]).timestamp()
    due_ns = int((opens - spans["reminder_lead_s"]) * 1e9)
    assert abs(deliver["start"] - due_ns) < 1e6 and deliver["end"] >= deliver["start"]
    # Linked to the Celery task that did the work; that task's trace holds its queries.
    task = next(s for s in all_spans if s["span_id"] in deliver["links"])
    assert "deliver_reminders" in task["name"]
    in_task = [s for s in all_spans if s["trace_id"] == task["trace_id"]]
    statements = " ".join(str(s["attributes"].get("db.statement", "")) for s in in_task)
    assert "reminders_notification" in statements  # the inbox write, a psycopg2 or SQLite span
    # The API call's own trace has its database and Redis work.
    in_call = [s for s in all_spans if s["trace_id"] == put["trace_id"]]
    database = {"postgresql": "postgresql", "sqlite": "sqlite"}[connection.vendor]
    assert any(s["attributes"].get("db.system") == database for s in in_call)
    assert any(s["attributes"].get("db.system") == "redis" for s in in_call)


def test_one_trace_from_the_api_call_to_the_timeout_firing(spans):
    all_spans = spans["spans"]
    post = _one(all_spans, kind="SERVER", name="POST api/timeouts/")
    fire = _one(all_spans, name="timeout.fire")
    assert fire["trace_id"] == post["trace_id"] and fire["parent_id"] == post["span_id"]
    assert fire["attributes"]["couponcenter.outcome"] == "fired"
    assert fire["attributes"]["couponcenter.topic"] == "timeout.default"


def test_tracing_is_off_by_default_and_stores_nothing(reminder_settings):
    assert not tracing.configured() and not tracing.enabled()
    coupon = CouponFactory(claim_opens_at=timezone.now().replace(microsecond=0).replace(
        year=timezone.now().year + 1))  # fmt: skip
    sub, _ = subscription_subscribe(user_id=5, coupon=coupon)
    sub.refresh_from_db()
    assert sub.traceparent == ""
