"""The big lists' helpers: the exact-id search, through the admins that use it, and the
paginator's estimated count."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.db import connection

from couponcenter.core.admin import ESTIMATE_ABOVE, EstimatedCountPaginator
from couponcenter.coupons.models import UserCoupon
from reminders.models import Notification, ReminderSubscription
from tests.support.factories import CouponFactory, UserCouponFactory

pytestmark = pytest.mark.django_db


def _found(term: str, model=ReminderSubscription) -> set[int]:
    model_admin = admin.site._registry[model]
    queryset, duplicates = model_admin.get_search_results(None, model.objects.all(), term)
    assert duplicates is False
    return set(queryset.values_list("pk", flat=True))


def test_an_id_is_matched_exactly_on_every_searched_column_and_anything_else_finds_nothing():
    first, second = CouponFactory(), CouponFactory()
    remind_at = first.claim_opens_at
    # Subscribed by an end user whose id is the second coupon's id.
    by_user = ReminderSubscription.objects.create(
        coupon=first, user_id=second.pk, remind_at=remind_at
    )
    of_coupon = ReminderSubscription.objects.create(
        coupon=second, user_id=987_654_321, remind_at=remind_at
    )

    assert _found(str(second.pk)) == {by_user.pk, of_coupon.pk}
    assert _found(" 987654321 ") == {of_coupon.pk}
    assert _found("98765432") == set()
    assert _found("") == {by_user.pk, of_coupon.pk}
    assert _found("abc") == set()
    assert _found("1" * 19) == set()  # past a BIGINT: not an id


def test_the_user_coupon_list_finds_an_end_users_coupons_by_their_exact_id():
    mine = UserCouponFactory(user_id=4242)
    theirs = UserCouponFactory(user_id=42)
    assert _found("4242", UserCoupon) == {mine.pk}
    assert _found("42", UserCoupon) == {theirs.pk}
    assert _found(str(mine.pk + theirs.pk + 10_000), UserCoupon) == set()
    assert _found("user 42", UserCoupon) == set()


@pytest.mark.postgres
def test_a_partitioned_tables_unfiltered_count_is_its_partitions_estimate():
    rows = ESTIMATE_ABOVE + 20_000
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Notification._meta.db_table} (user_id, dedup_key, kind, title, body, "
            "payload, created_at, visible_at, push, held) SELECT g, 'k', 'x', '', '', '{}', "
            "now(), now() - (g %% 3) * interval '1 day', true, false "
            "FROM generate_series(1, %s) g",
            [rows],
        )
        cursor.execute(f"ANALYZE {Notification._meta.db_table}")

    count = EstimatedCountPaginator(Notification.objects.order_by("-id"), 10).count

    assert abs(count - rows) < rows * 0.05  # the planner's estimate, not the capped count
    assert (
        EstimatedCountPaginator(Notification.objects.filter(user_id=1).order_by("-id"), 10).count
        == 1
    )
