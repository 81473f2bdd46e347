"""The console's "near a quota" table: topics at 80 % of their pending-jobs limit or more, and
accounts that filled 80 % of their creations per second within the last minute."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from reminders.models import TimeoutTopic
from reminders.selectors import quotas as quota_selectors
from reminders.services import quotas as quota_services
from reminders.services import timeout_job_create, timeout_topic_save
from reminders.services.quotas import quota_creations_take
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db


def _rows(page: str) -> list[str]:
    table = re.search(r'<table[^>]*id="cc-quotas".*?</table>', page, re.S)
    assert table, "no quota table on the console"
    rows = re.findall(r"<tr[^>]*data-quota[^>]*>(.*?)</tr>", table.group(0), re.S)
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in rows]


def test_the_console_lists_who_is_near_a_quota(
    reminder_settings, django_capture_on_commit_callbacks, monkeypatch
):
    reminder_settings.change(quota_pending_per_topic=5, quota_creations_per_s=100)
    tenant = UserFactory(username="acme-svc")
    calm = UserFactory(username="calm-svc")
    timeout_topic_save(topic=TimeoutTopic(name="acme.close"), type="log", owner_user=tenant)
    timeout_topic_save(topic=TimeoutTopic(name="calm.close"), type="log", owner_user=calm)
    at = timezone.now() + timedelta(hours=1)
    with django_capture_on_commit_callbacks(execute=True):
        for n in range(4):  # 4 of 5: 80 %
            timeout_job_create(topic="acme.close", biz_type="o", biz_id=str(n), action_time=at)
        timeout_job_create(topic="calm.close", biz_type="o", biz_id="1", action_time=at)
    # Creations: counted for an owner however it spreads them over topics. The clock stands
    # still, so the buckets read as they were filled.
    for module in (quota_selectors, quota_services):
        monkeypatch.setattr(module, "epoch_ms", lambda: 1_900_000_000_000)
    reminder_settings.change(quota_pending_per_topic=0)
    quota_creations_take(owner_id=tenant.pk, new_per_topic={"acme.close": 95})
    quota_creations_take(owner_id=calm.pk, new_per_topic={"calm.close": 10})
    reminder_settings.change(quota_pending_per_topic=5)
    staff = Client()
    staff.force_login(UserFactory(is_staff=True, is_superuser=True))

    rows = _rows(staff.get("/admin/console/", {"partial": "1"}).content.decode())

    assert len(rows) == 2, rows
    pending, creations = rows
    assert pending.startswith("pending jobs per topic acme.close (user acme-svc) 4 / 5 (80%)")
    assert creations.startswith("creations per second account acme-svc")
    assert "95 / 100 (95%)" in creations
    assert not any("calm" in row for row in rows)
