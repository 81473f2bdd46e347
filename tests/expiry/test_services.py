"""The sweeper services on a real database: what a batch touches, bounds, cleanup, settings."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db.models import F
from django.utils import timezone

from couponcenter.coupons.models import UserCoupon
from expiry import selectors, services
from expiry.models import ExpirySettings, ExpiryTask
from tests.support.factories import ExpiryTaskFactory, UserCouponFactory

pytestmark = pytest.mark.django_db

Status = UserCoupon.Status


@pytest.fixture(autouse=True)
def _fresh_settings():
    services.expiry_settings_cache_clear()
    yield
    services.expiry_settings_cache_clear()


def make_task(*, expires_at, status=Status.UNUSED, task_status=ExpiryTask.Status.PENDING):
    user_coupon = UserCouponFactory(
        expires_at=expires_at,
        claimed_at=expires_at - timedelta(days=1),
        status=status,
        used_at=expires_at - timedelta(hours=1) if status == Status.USED else None,
    )
    return ExpiryTaskFactory(user_coupon=user_coupon, status=task_status)


def statuses(tasks):
    ids = [task.pk for task in tasks]
    rows = ExpiryTask.objects.filter(pk__in=ids).values_list("status", "user_coupon__status")
    return sorted(rows)


def test_sweep_expires_only_due_unused_coupons_and_marks_tasks_processed():
    now = timezone.now()
    due = [make_task(expires_at=now - timedelta(minutes=i + 1)) for i in range(3)]
    at_now = make_task(expires_at=now)
    later = make_task(expires_at=now + timedelta(seconds=1))

    result = services.expiry_sweep_batch(now=now, batch_size=100)

    assert (result.claimed, result.processed, result.expired) == (4, 4, 4)
    assert statuses([*due, at_now]) == [("processed", "expired")] * 4
    assert statuses([later]) == [("pending", "unused")]


def test_used_coupons_are_not_touched():
    now = timezone.now()
    # A used coupon whose task is still pending (e.g. a redeem that predates the task update).
    used = make_task(expires_at=now - timedelta(minutes=1), status=Status.USED)
    unused = make_task(expires_at=now - timedelta(minutes=1))

    result = services.expiry_sweep_batch(now=now, batch_size=100)

    assert (result.processed, result.expired) == (2, 1)
    used.user_coupon.refresh_from_db()
    assert used.user_coupon.status == Status.USED
    assert statuses([used, unused]) == [("processed", "expired"), ("processed", "used")]


def test_a_batch_expires_exactly_its_own_coupons_whether_or_not_their_ids_run_unbroken():
    now = timezone.now()
    due = now - timedelta(minutes=1)
    # Claimed one after another: one run of ids, updated by one walk of the key range.
    run = [make_task(expires_at=due) for _ in range(4)]
    after_run = make_task(expires_at=now + timedelta(minutes=1))
    result = services.expiry_sweep_batch(now=now, batch_size=100)
    assert (result.claimed, result.processed, result.expired) == (4, 4, 4)
    assert statuses(run) == [("processed", "expired")] * 4
    assert statuses([after_run]) == [("pending", "unused")]

    # Claims not yet due, a used one and a deleted one between the due ones: the ids of the next
    # batch's coupons have holes, and the coupons in the holes are left as they were.
    first = make_task(expires_at=due)
    not_due = make_task(expires_at=now + timedelta(minutes=1))
    second = make_task(expires_at=due)
    used = make_task(expires_at=due, status=Status.USED, task_status=ExpiryTask.Status.PROCESSED)
    gone = make_task(expires_at=due)
    third = make_task(expires_at=due)
    UserCoupon.objects.filter(pk=gone.user_coupon_id).delete()
    result = services.expiry_sweep_batch(now=now, batch_size=100)
    assert (result.claimed, result.processed, result.expired) == (3, 3, 3)
    assert statuses([first, second, third]) == [("processed", "expired")] * 3
    assert statuses([not_due, after_run]) == [("pending", "unused")] * 2
    assert statuses([used]) == [("processed", "used")]


def test_processed_tasks_are_not_swept_again():
    now = timezone.now()
    make_task(expires_at=now - timedelta(minutes=1), task_status=ExpiryTask.Status.PROCESSED)
    result = services.expiry_sweep_batch(now=now, batch_size=100)
    assert (result.claimed, result.expired) == (0, 0)
    assert UserCoupon.objects.filter(status=Status.EXPIRED).count() == 0


def test_a_batch_is_bounded_and_takes_the_oldest_first():
    now = timezone.now()
    tasks = [make_task(expires_at=now - timedelta(minutes=10 - i)) for i in range(5)]

    result = services.expiry_sweep_batch(now=now, batch_size=2, collect_ids=True)

    assert (result.claimed, result.processed) == (2, 2)
    assert result.task_ids == tuple(sorted(task.pk for task in tasks[:2]))
    assert ExpiryTask.objects.filter(status=ExpiryTask.Status.PENDING).count() == 3


def test_sweep_due_repeats_while_batches_are_full_and_stops_on_a_short_one():
    now = timezone.now()
    for i in range(5):
        make_task(expires_at=now - timedelta(seconds=i + 1))
    seen = []

    totals = services.expiry_sweep_due(now=now, batch_size=2, progress=seen.append)

    assert [r.claimed for r in seen] == [2, 2, 1]
    assert (totals.batches, totals.processed, totals.expired) == (3, 5, 5)


def test_a_pass_resumes_each_batch_after_the_last_ones_key():
    now = timezone.now()
    same_moment = now - timedelta(minutes=5)  # ties: the id orders tasks due together
    tasks = [make_task(expires_at=same_moment) for _ in range(4)]
    tasks += [make_task(expires_at=now - timedelta(minutes=1)) for _ in range(3)]
    keys = sorted((task.expire_at, task.pk) for task in tasks)
    seen = []

    services.expiry_sweep_due(now=now, batch_size=3, collect_ids=True, progress=seen.append)

    assert [r.task_ids for r in seen] == [
        tuple(pk for _, pk in keys[0:3]),
        tuple(pk for _, pk in keys[3:6]),
        tuple(pk for _, pk in keys[6:7]),
    ]
    assert [r.last for r in seen] == [keys[2], keys[5], keys[6]]


@pytest.mark.parametrize("descending", [False, True], ids=["up", "down"])
def test_each_batch_ends_at_its_last_task_in_due_order_whatever_order_the_ids_are_in(descending):
    """A batch's ``last`` is where the next one starts: the batch's greatest (expire_at, id) in
    its walk's order, whether the batch is due at one moment or at several, cut in the middle of
    a moment or not, and with ids that disagree with the due order."""
    now = timezone.now()
    moments = [now - timedelta(minutes=m) for m in (3, 2, 1)]
    due = [2, 2, 1, 1, 1, 0, 0, 1]  # created latest-due first: ids run against the due order
    tasks = [make_task(expires_at=moments[m]) for m in due]
    keys = sorted(((task.expire_at, task.pk) for task in tasks), reverse=descending)
    batches, after = [], None

    while True:
        result = services.expiry_sweep_batch(
            now=now, batch_size=3, collect_ids=True, after=after, descending=descending
        )
        if not result.claimed:
            break
        batches.append((sorted(result.task_ids), result.last))
        after = result.last

    assert batches == [
        (sorted(pk for _, pk in keys[0:3]), keys[2]),
        (sorted(pk for _, pk in keys[3:6]), keys[5]),
        (sorted(pk for _, pk in keys[6:8]), keys[7]),
    ]
    assert statuses(tasks) == [("processed", "expired")] * 8


def test_a_batch_takes_only_tasks_after_the_given_key_and_the_next_pass_takes_the_rest():
    now = timezone.now()
    early, late = (make_task(expires_at=now - timedelta(minutes=m)) for m in (5, 1))
    early_key = (early.expire_at, early.pk)

    result = services.expiry_sweep_batch(now=now, batch_size=10, after=early_key)

    assert result.claimed == 1 and result.last == (late.expire_at, late.pk)
    assert statuses([early, late]) == [("pending", "unused"), ("processed", "expired")]
    # A task behind a pass's key (skipped while another transaction held it) waits for the
    # next pass, which starts at the head again.
    assert services.expiry_sweep_due(now=now, batch_size=10).processed == 1
    assert statuses([early]) == [("processed", "expired")]


def test_sweep_due_with_exact_multiple_ends_on_an_empty_batch():
    now = timezone.now()
    for i in range(4):
        make_task(expires_at=now - timedelta(seconds=i + 1))
    totals = services.expiry_sweep_due(now=now, batch_size=2, keep_results=True)
    assert [r.claimed for r in totals.results] == [2, 2, 0]


def test_sweep_due_honours_should_stop_between_batches():
    now = timezone.now()
    for i in range(6):
        make_task(expires_at=now - timedelta(seconds=i + 1))
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) > 1  # allow exactly one batch

    totals = services.expiry_sweep_due(now=now, batch_size=2, should_stop=should_stop)
    assert totals.processed == 2
    assert ExpiryTask.objects.filter(status=ExpiryTask.Status.PENDING).count() == 4


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError):
        services.expiry_sweep_batch(now=timezone.now(), batch_size=0)


def test_cleanup_deletes_only_processed_tasks_past_retention():
    now = timezone.now()
    old_processed = [
        make_task(expires_at=now - timedelta(days=9), task_status="processed") for _ in range(3)
    ]
    ExpiryTask.objects.filter(pk__in=[t.pk for t in old_processed]).update(
        updated_at=now - timedelta(days=8)
    )
    recent = make_task(expires_at=now - timedelta(days=1), task_status="processed")
    old_pending = make_task(expires_at=now - timedelta(days=9))
    ExpiryTask.objects.filter(pk=old_pending.pk).update(updated_at=now - timedelta(days=8))

    deleted = services.expiry_cleanup(now=now, retention=timedelta(days=7), batch_size=2)

    assert deleted == 3
    assert set(ExpiryTask.objects.values_list("pk", flat=True)) == {recent.pk, old_pending.pk}
    # The coupons themselves stay: only the task rows go.
    assert UserCoupon.objects.count() == 5


def test_next_due_at_is_the_earliest_pending_task():
    now = timezone.now()
    assert services.next_due_at() is None
    make_task(expires_at=now - timedelta(hours=2), task_status="processed")
    make_task(expires_at=now + timedelta(minutes=5))
    make_task(expires_at=now + timedelta(minutes=1))
    assert services.next_due_at() == now + timedelta(minutes=1)


def test_settings_get_creates_one_row_and_sees_changes():
    config = services.expiry_settings_get(max_age_s=0)
    assert (config.batch_size, config.interval) == (2000, timedelta(seconds=60))
    assert services.expiry_settings_get().pk == config.pk  # cached

    ExpirySettings.objects.filter(pk=config.pk).update(batch_size=7, version=F("version") + 1)
    assert services.expiry_settings_get(max_age_s=0).batch_size == 7
    assert ExpirySettings.objects.count() == 1


def test_settings_bounds_are_the_models():
    ExpirySettings(batch_size=1, interval=timedelta(seconds=1), retention=timedelta(0)).full_clean()
    bad = ExpirySettings(batch_size=0, interval=timedelta(0), retention=timedelta(seconds=-1))
    with pytest.raises(ValidationError) as refused:
        bad.full_clean()
    assert set(refused.value.message_dict) == {"batch_size", "interval", "retention"}


def test_selectors_report_backlog_and_oldest_due_task():
    now = timezone.now()
    oldest = make_task(expires_at=now - timedelta(minutes=5))
    make_task(expires_at=now - timedelta(minutes=1))
    make_task(expires_at=now + timedelta(minutes=1))

    stats = selectors.expiry_stats(now=now)

    assert stats["pending_due"] == 2
    assert stats["oldest_due_at"] == oldest.expire_at
    assert stats["lag_seconds"] == pytest.approx(300, abs=1)
    assert selectors.pending_due_count(now=now, cap=1) == 1


def test_settings_admin_form_gives_clear_errors():
    from expiry.admin import ExpirySettingsForm

    form = ExpirySettingsForm(
        data={
            "batch_size": "0",
            "interval": "0",
            "retention": "-1 0:00:00",
            "user_coupon_retention": "P3651D",
        }
    )
    assert not form.is_valid()
    assert set(form.errors) == {"batch_size", "interval", "retention", "user_coupon_retention"}
    # The model's bound, in its own words: one set of rules for the admin and the API.
    assert form.errors["interval"] == ["Ensure this value is greater than or equal to PT1S."]
    assert form.errors["user_coupon_retention"] == [
        "Ensure this value is less than or equal to P3650D."
    ]
    good = ExpirySettingsForm(
        data={
            "batch_size": "500",
            "interval": "30",
            "retention": "0",
            "user_coupon_retention": "P180D",
        }
    )
    assert good.is_valid(), good.errors


def test_admin_pages(admin_client):
    make_task(expires_at=timezone.now())
    assert admin_client.get("/admin/expiry/expirytask/?q=10001").status_code == 200
    assert admin_client.get("/admin/expiry/expirytask/?q=not-a-number").status_code == 200
    response = admin_client.get("/admin/expiry/expirysettings/")
    assert response.status_code == 302 and "/change/" in response["Location"]
    assert admin_client.get(response["Location"]).status_code == 200
    assert admin_client.get("/admin/expiry/expirysettings/add/").status_code == 403


def test_admin_search_finds_tasks_by_the_exact_end_user_id():
    from django.contrib import admin

    mine, other = make_task(expires_at=timezone.now()), make_task(expires_at=timezone.now())
    task_admin = admin.site._registry[ExpiryTask]

    def found(term):
        queryset, _ = task_admin.get_search_results(None, ExpiryTask.objects.all(), term)
        return set(queryset.values_list("pk", flat=True))

    assert found(str(mine.user_coupon.user_id)) == {mine.pk}
    assert found(str(mine.user_coupon.user_id)[:-1]) == set()
    assert found("not-a-number") == set()
    assert found("") == {mine.pk, other.pk}
