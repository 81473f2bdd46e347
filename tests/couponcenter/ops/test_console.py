"""The operations console: selectors, the overview page, dead letters, live config, access."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from couponcenter.core.durations import iso_duration
from couponcenter.ops import overview
from expiry.models import ExpirySettings
from reminders import metrics
from reminders.engine import keys, leases, queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from reminders.models import ReminderSettings, ReminderSubscription, TimeoutJob
from reminders.selectors import dead_letters, queues
from reminders.services import dead_letters as dead_letter_services
from reminders.services import timeout_job_create
from reminders.services.retention import RETENTIONS
from tests.support.console import (
    dead_members,
    kill_reminders,
    member,
    overdue_reminders,
    scripts_client,
)
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db

CONSOLE_PAGES = [
    "/admin/console/",
    "/admin/reminders/deadletter/",
    "/admin/reminders/remindersettings/",
    "/admin/expiry/expirysettings/",
    "/admin/console/retention/",
]
RETENTION_FIELDS = [field for _, field, _ in RETENTIONS]


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def overdue(reminder_settings, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        return overdue_reminders(range(5000, 5012))


@pytest.fixture
def dead(overdue):
    kill_reminders(overdue[:5])
    return overdue[:5]


def settings_form(row: ReminderSettings, **overrides) -> dict:
    data = {
        "slots": row.slots, "batch_size": row.batch_size, "tick_interval_ms": row.tick_interval_ms,
        "gateway": row.gateway, "visibility_timeout_ms": row.visibility_timeout_ms,
        "max_attempts": row.max_attempts, "backoff_ms": row.backoff_ms,
        "merge_window_ms": row.merge_window_ms, "late_policy": row.late_policy,
        "late_limit": "PT5M", "max_delivery_queue": row.max_delivery_queue,
        "backlog_warning": row.backlog_warning, "lateness_warning_ms": row.lateness_warning_ms,
        "prestage_ms": row.prestage_ms, "push_cap_per_day": row.push_cap_per_day,
        "over_cap": row.over_cap, "quota_pending_per_topic": row.quota_pending_per_topic,
        "quota_creations_per_s": row.quota_creations_per_s,
        "quota_attribute_bytes": row.quota_attribute_bytes,
        **{name: iso_duration(getattr(row, name)) for name in RETENTION_FIELDS},
    }  # fmt: skip
    data.update(overrides)
    return data


# --- access ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", CONSOLE_PAGES)
def test_non_staff_and_anonymous_get_no_console_page(client, path, reminder_settings):
    assert client.get(path).status_code == 302  # to the login page
    client.force_login(UserFactory(is_staff=False))
    response = client.get(path)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_non_staff_cannot_post_dead_letter_actions(client, dead):
    client.force_login(UserFactory(is_staff=False))
    keys = [dead_letters.dead_letter_key(REMINDER_TOPIC, s.slot, member(s)) for s in dead]
    response = client.post("/admin/reminders/deadletter/",
                           {"action": "purge_selected", "confirm": "yes",
                            "_selected_action": keys})  # fmt: skip
    assert response.status_code == 302
    assert dead_members() == {member(s) for s in dead}


def test_staff_without_permissions_cannot_act_on_dead_letters(client, dead):
    client.force_login(UserFactory(is_staff=True))
    keys = [dead_letters.dead_letter_key(REMINDER_TOPIC, s.slot, member(s)) for s in dead]
    response = client.post("/admin/reminders/deadletter/",
                           {"action": "purge_selected", "confirm": "yes",
                            "_selected_action": keys})  # fmt: skip
    assert response.status_code == 403
    assert len(dead_members()) == 5


# --- selectors ---------------------------------------------------------------------------------


def test_backlog_counts_overdue_entries_per_slot(overdue):
    data = queues.backlog()
    (topic,) = [t for t in data.topics if t.topic == REMINDER_TOPIC]
    assert topic.store == topic.due == 12
    assert 25_000 <= topic.oldest_overdue_ms < 120_000
    assert sum(s.store for s in topic.slots) == 12
    assert len(topic.slots) == ReminderSettings.objects.get().slots
    assert data.totals["due"] == 12


def test_warnings_follow_the_thresholds(overdue, reminder_settings):
    live = reminder_settings.change(backlog_warning=11, lateness_warning_ms=100)
    metrics.record(REMINDER_TOPIC, {"delivered": 3}, [400, 400, 400])
    series = queues.throughput()
    p99 = queues.recent_p99_ms(series)
    assert p99 == 498  # interpolated inside the 250-500 ms bucket the samples fall in
    text = " ".join(overview.warnings(data=queues.backlog(), p99_ms=p99, live=live))
    assert "Overdue backlog is 12" in text and "p99 delivery lateness is 498 ms" in text
    live = reminder_settings.change(backlog_warning=12, lateness_warning_ms=500)
    assert overview.warnings(data=queues.backlog(), p99_ms=p99, live=live) == []


def test_workers_report_config_version_seen(reminder_settings):
    now = epoch_ms()
    leases.heartbeat(leases.WorkerInfo(worker_id="h:1:a", heartbeat_ms=now, host="h", pid=1,
                                       config_version=reminder_settings.version,
                                       owned={REMINDER_TOPIC: [0, 1, 2, 5]}))  # fmt: skip
    leases.heartbeat(leases.WorkerInfo(worker_id="h:2:b", heartbeat_ms=now - 60_000, host="h",
                                       pid=2, config_version=0))  # fmt: skip
    first, second = queues.workers()
    assert (first.pid, first.live, first.current) == (1, True, True)
    assert first.owned_summary == f"{REMINDER_TOPIC}: 0-2, 5"
    assert (second.pid, second.live, second.current) == (2, False, False)


def test_dead_letter_list_filters_and_search(dead, overdue):
    page = dead_letters.dead_letter_list()
    assert page.total == 5 and {d.job_id for d in page.letters} == {member(s) for s in dead}
    one = dead[0]
    assert {d.last_error for d in page.letters} == {"gateway said 503"}
    # A member names only its subscription: the user comes from the row.
    assert {(d.job_id, d.user_id) for d in page.letters} == {(member(s), s.user_id) for s in dead}
    assert [d.job_id for d in dead_letters.dead_letter_list(search=member(one)).letters] == [
        member(one)
    ]
    by_slot = dead_letters.dead_letter_list(topic=REMINDER_TOPIC, slot=one.slot)
    assert {d.slot for d in by_slot.letters} == {one.slot}
    found = dead_letters.dead_letter_list(search=str(one.pk)).letters
    assert [d.job_id for d in found] == [member(one)]
    assert [d.user_id for d in dead_letters.dead_letter_list(search=str(one.user_id)).letters] == [
        one.user_id
    ]
    assert dead_letters.dead_letter_list(search=str(overdue[-1].user_id)).letters == []  # not dead
    assert dead_letters.dead_letter_list(search="nonsense").letters == []


def test_a_dead_member_made_of_digits_is_found_as_listed(reminder_settings):
    """Base 36 members can be all digits ("123" is subscription 1371): pasted from the list into
    the search box, it must find its entry, not only subscriptions and users numbered 123."""
    client, k = scripts_client(), keys.slot_keys(REMINDER_TOPIC, 0)
    queue.schedule(REMINDER_TOPIC, "123", epoch_ms() - 1000, slot=0)
    token = scripts.lease_acquire(client, k, holder="console-test", ttl_ms=60_000)
    queue.claim(REMINDER_TOPIC, 0, now_ms=epoch_ms(), limit=10, visibility_ms=60_000,
                lease_token=token)  # fmt: skip
    queue.bury(REMINDER_TOPIC, 0, [("123", "gateway said 503")], now_ms=epoch_ms(),
               lease_token=token)  # fmt: skip
    scripts.lease_release(client, k.lease, token=token)

    found = dead_letters.dead_letter_list(search="123").letters
    assert [(d.topic, d.slot, d.job_id) for d in found] == [(REMINDER_TOPIC, 0, "123")]


def test_dead_letters_are_found_by_error_text(dead, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):  # indexed in Redis on commit
        subs = overdue_reminders(range(7600, 7602))
    kill_reminders(subs, error="TLS handshake timed out")
    found = dead_letters.dead_letter_list(search="error:handshake").letters
    assert len(found) == 2 and all("handshake" in d.last_error for d in found)
    assert len(dead_letters.dead_letter_list(search="error:503").letters) == len(dead)
    assert dead_letters.dead_letter_list(search="error:no such text").letters == []


def test_dead_timeout_jobs_are_found_by_business_key(
    reminder_settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):  # indexed in Redis on commit
        job = timeout_job_create(topic="timeout.default", biz_type="order", biz_id="K-9",
                                 action_time=timezone.now())  # fmt: skip
    client = scripts_client()
    lease = keys.slot_keys("timeout.default", job.slot)
    token = scripts.lease_acquire(client, lease, holder="t", ttl_ms=60_000)
    queue.claim("timeout.default", job.slot, now_ms=10**13, limit=10, visibility_ms=60_000,
                lease_token=token)  # fmt: skip
    queue.bury("timeout.default", job.slot, [(str(job.pk), "HTTP 410")], now_ms=epoch_ms(),
               lease_token=token)  # fmt: skip
    found = dead_letters.dead_letter_list(search="order:K-9").letters
    assert [(d.job_id, d.last_error) for d in found] == [(str(job.pk), "HTTP 410")]
    assert dead_letters.dead_letter_list(search="order:K-10").letters == []


# --- services ----------------------------------------------------------------------------------


def test_requeue_puts_rows_and_entries_back(dead, django_capture_on_commit_callbacks):
    one = dead[0]
    with django_capture_on_commit_callbacks(execute=True):
        result = dead_letter_services.dead_letters_requeue(
            topic=REMINDER_TOPIC, slot=one.slot, job_ids=[member(one), "999:1:1"]
        )
    assert (result.requested, result.rows_fixed, result.requeued) == (2, 1, 1)
    one.refresh_from_db()
    assert one.status == ReminderSubscription.Status.SCHEDULED
    assert member(one) not in dead_members()
    (stats,) = [t for t in queues.backlog().topics if t.topic == REMINDER_TOPIC]
    assert stats.dead == 4


def test_requeue_timeout_job_resets_status_and_attempts(
    make_dead_timeout_job, django_capture_on_commit_callbacks
):
    job, topic = make_dead_timeout_job()
    with django_capture_on_commit_callbacks(execute=True):
        result = dead_letter_services.dead_letters_requeue_matching(topic=topic)
    assert result.requeued == 1
    job.refresh_from_db()
    assert (job.status, job.attempts) == (TimeoutJob.Status.PENDING, 0)
    assert dead_letters.dead_matching_count(topic=topic) == 0


def test_requeue_matching_is_capped(dead, django_capture_on_commit_callbacks, monkeypatch):
    monkeypatch.setattr(dead_letter_services, "REQUEUE_CAP", 2)
    with django_capture_on_commit_callbacks(execute=True):
        result = dead_letter_services.dead_letters_requeue_matching(topic=REMINDER_TOPIC, limit=100)
    assert result.requeued == 2 and len(dead_members()) == 3


# --- pages -------------------------------------------------------------------------------------


def test_overview_shows_the_backlog_workers_charts_and_expiry(staff, overdue, reminder_settings):
    reminder_settings.change(backlog_warning=5)
    metrics.record(REMINDER_TOPIC, {"dispatched": 7, "delivered": 6}, [20, 30])
    response = staff.get("/admin/console/")
    assert response.status_code == 200
    html = response.content.decode()
    assert re.search(r'id="total-due">12<', html)
    assert f'data-topic="{REMINDER_TOPIC}"' in html
    assert "Overdue backlog is 12 entries" in html  # the warning banner
    assert html.count("<svg") == 4 and "<polyline" in html or "<circle" in html
    assert 'http-equiv="refresh"' in html
    assert "Expiry sweeper" in html and "No worker is heartbeating" in html
    assert "<script src" not in html.replace('src="/static/', "")  # nothing from elsewhere


def test_admin_index_links_to_the_console(staff):
    assert 'href="/admin/console/"' in staff.get("/admin/").content.decode()


def test_dead_letter_list_page_and_filters(staff, dead):
    def row(sub) -> str:
        return f'<tr data-job="{member(sub)}">'

    html = staff.get("/admin/reminders/deadletter/").content.decode()
    assert all(row(s) in html for s in dead) and "gateway said 503" in html
    one = dead[0]
    html = staff.get(f"/admin/reminders/deadletter/?q={one.user_id}").content.decode()
    assert row(one) in html and row(dead[1]) not in html
    html = staff.get(
        f"/admin/reminders/deadletter/?topic={REMINDER_TOPIC}&slot={one.slot}"
    ).content.decode()
    assert row(one) in html
    assert staff.get("/admin/reminders/deadletter/?topic=nope&slot=x&p=zz").status_code == 200


def test_requeue_selected_confirms_then_requeues_and_logs(
    staff, dead, django_capture_on_commit_callbacks
):
    keys = [dead_letters.dead_letter_key(REMINDER_TOPIC, s.slot, member(s)) for s in dead[:2]]
    url = "/admin/reminders/deadletter/"
    confirm = staff.post(url, {"action": "requeue_selected", "_selected_action": keys})
    assert confirm.status_code == 200
    assert re.search(r'id="dl-confirm-count">2<', confirm.content.decode())
    assert len(dead_members()) == 5  # nothing done yet
    with django_capture_on_commit_callbacks(execute=True):  # outside a test: at once
        done = staff.post(
            url, {"action": "requeue_selected", "confirm": "yes", "_selected_action": keys}
        )
    assert done.status_code == 302
    assert dead_members() == {member(s) for s in dead[2:]}
    assert (
        ReminderSubscription.objects.filter(
            pk__in=[s.pk for s in dead[:2]], status="scheduled"
        ).count()
        == 2
    )
    logs = LogEntry.objects.filter(content_type__model="deadletter", action_flag=CHANGE)
    assert sorted(e.object_id for e in logs) == sorted(keys)


def test_purge_selected_confirms_then_purges_and_logs(staff, dead):
    keys = [dead_letters.dead_letter_key(REMINDER_TOPIC, dead[0].slot, member(dead[0]))]
    url = "/admin/reminders/deadletter/"
    confirm = staff.post(url, {"action": "purge_selected", "_selected_action": keys})
    assert 'will touch <strong id="dl-confirm-count">1<' in confirm.content.decode()
    staff.post(url, {"action": "purge_selected", "confirm": "yes", "_selected_action": keys})
    assert member(dead[0]) not in dead_members() and len(dead_members()) == 4
    dead[0].refresh_from_db()
    assert dead[0].status == ReminderSubscription.Status.FAILED  # the truth stays
    assert LogEntry.objects.filter(action_flag=DELETION, object_id=keys[0]).exists()


def test_requeue_all_matching_the_filter(staff, dead, django_capture_on_commit_callbacks):
    url = "/admin/reminders/deadletter/"
    form = {"action": "requeue_matching", "topic": REMINDER_TOPIC}
    confirm = staff.post(url, form)
    assert re.search(r'id="dl-confirm-count">5<', confirm.content.decode())
    with django_capture_on_commit_callbacks(execute=True):
        staff.post(url, {**form, "confirm": "yes"})
    assert dead_members() == set()
    entry = LogEntry.objects.get(content_type__model="deadletter")
    assert "dead letters matching coupon.reminder slot *" in entry.change_message
    # without a topic the action is not offered
    response = staff.post(url, {"action": "requeue_matching", "confirm": "yes"}, follow=True)
    assert "Choose an action you may run" in response.content.decode()


# --- live configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("slots", "12", "is not a power of two"),
        ("batch_size", "0", "greater than or equal to 1"),
        ("tick_interval_ms", "-5", "greater than or equal to"),
    ],
)
def test_reminder_settings_form_rejects_bad_values(staff, reminder_settings, field, value, message):
    before = ReminderSettings.objects.get()
    url = reverse("admin:reminders_remindersettings_change", args=[before.pk])
    response = staff.post(url, settings_form(before, **{field: value}))
    assert response.status_code == 200
    assert message in response.content.decode()
    after = ReminderSettings.objects.get()
    assert (after.version, getattr(after, field)) == (before.version, getattr(before, field))


def test_reminder_settings_change_bumps_version_logs_and_lists_workers(staff, reminder_settings):
    row = ReminderSettings.objects.get()
    url = reverse("admin:reminders_remindersettings_change", args=[row.pk])
    assert staff.post(url, settings_form(row, batch_size=777)).status_code == 302
    after = ReminderSettings.objects.get()
    assert (after.batch_size, after.version) == (777, row.version + 1)
    entry = LogEntry.objects.get(content_type__model="remindersettings")
    assert "Batch size" in entry.get_change_message()
    leases.heartbeat(leases.WorkerInfo(worker_id="w:9:x", heartbeat_ms=epoch_ms(),
                                       host="w", pid=9, config_version=row.version))  # fmt: skip
    html = staff.get(url).content.decode()
    assert 'data-pid="9"' in html and "not yet" in html
    history = staff.get(reverse("admin:reminders_remindersettings_history", args=[row.pk]))
    assert "Changed Batch size" in history.content.decode()


@pytest.mark.parametrize(
    ("field", "value"), [("batch_size", "0"), ("interval", "-00:00:05"), ("interval", "0")]
)
def test_expiry_settings_form_rejects_bad_values(staff, field, value):
    config = ExpirySettings.objects.create()
    url = reverse("admin:expiry_expirysettings_change", args=[config.pk])
    data = {"batch_size": "500", "interval": "00:01:00", "retention": "7 00:00:00", field: value}
    response = staff.post(url, data)
    assert response.status_code == 200 and "errorlist" in response.content.decode()
    config.refresh_from_db()
    assert (config.batch_size, config.interval) == (2000, timedelta(seconds=60))


# --- the domain lists --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/admin/reminders/remindersubscription/",
        "/admin/reminders/remindersubscription/?q=5000",
        "/admin/reminders/remindersubscription/?q=abc",
        "/admin/reminders/remindersubscription/?status__exact=failed",
        "/admin/reminders/timeoutjob/",
        "/admin/reminders/timeoutjob/?q=1",
        "/admin/reminders/timeoutjob/?q=order-1",
        "/admin/reminders/notification/",
        "/admin/reminders/notification/?q=5000",
        "/admin/couponcenter/coupon/",
        "/admin/couponcenter/usercoupon/",
        "/admin/expiry/expirytask/",
    ],
)
def test_domain_changelists_load(staff, overdue, path):
    assert staff.get(path).status_code == 200


@pytest.fixture
def make_dead_timeout_job(django_capture_on_commit_callbacks):
    """A generic timeout job that failed its last attempt: DEAD row, entry in the dead queue."""
    from django.utils import timezone

    from couponcenter.core.redis import get_redis
    from reminders.engine import keys, queue, scripts
    from reminders.services import timeout_job_create

    def make():
        topic = "timeout.default"
        with django_capture_on_commit_callbacks(execute=True):
            job = timeout_job_create(topic=topic, biz_type="order", biz_id="order-1",
                                     action_time=timezone.now())  # fmt: skip
        token = scripts.lease_acquire(get_redis(), keys.slot_keys(topic, job.slot),
                                      holder="test", ttl_ms=60_000)  # fmt: skip
        queue.claim(topic, job.slot, now_ms=10**13, limit=10, visibility_ms=60_000,
                    lease_token=token)  # fmt: skip
        queue.bury(topic, job.slot, [(str(job.pk), "boom")], now_ms=0, lease_token=token)
        TimeoutJob.objects.filter(pk=job.pk).update(status=TimeoutJob.Status.DEAD, attempts=16)
        return job, topic

    return make


# --- coupons: counts on the change page, moving the opening time ---------------------------------


def test_coupon_change_page_shows_counts(staff, overdue):
    from tests.support.factories import UserCouponFactory

    coupon = overdue[0].coupon
    UserCouponFactory(coupon=coupon, status="expired")
    html = staff.get(reverse("admin:couponcenter_coupon_change", args=[coupon.pk])).content
    html = html.decode()
    readonly = r':\s*</label>\s*<div class="readonly">'
    assert re.search(r"Subscribed \(reminders scheduled\)" + readonly + "12<", html)
    assert re.search("Expired" + readonly + '<a id="coupon-expired" href="[^"]+">1</a><', html)


def test_move_opening_time_goes_through_the_service(
    staff, overdue, django_capture_on_commit_callbacks
):
    coupon = overdue[0].coupon
    opens = coupon.claim_opens_at
    url = reverse("admin:couponcenter_coupon_changelist")
    form = {"action": "move_opening_time", "_selected_action": [coupon.pk]}
    page = staff.post(url, form)
    assert page.status_code == 200 and 'id="move-count">1<' in page.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        staff.post(url, {**form, "apply": "1", "shift": "01:00:00"})
    coupon.refresh_from_db()
    assert coupon.claim_opens_at == opens + timedelta(hours=1)
    overdue[0].refresh_from_db()
    assert overdue[0].remind_at == coupon.claim_opens_at - timedelta(seconds=60)
    (topic,) = [t for t in queues.backlog().topics if t.topic == REMINDER_TOPIC]
    assert (topic.store, topic.due) == (12, 0)  # the reminders moved with it


def test_list_pages_count_results_only_when_narrowed(staff, overdue):
    """Unfiltered, "N results (Show all)" said nothing: the count shows for a search or filter."""
    plain = staff.get("/admin/reminders/remindersubscription/").content.decode()
    assert "Show all" not in plain
    searched = staff.get("/admin/reminders/remindersubscription/", {"q": "4242"}).content.decode()
    assert "Show all" in searched
    filtered = staff.get("/admin/reminders/remindersubscription/",
                         {"status__exact": "scheduled"}).content.decode()  # fmt: skip
    assert "Show all" in filtered
