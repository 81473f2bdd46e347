"""Server-side prepared statements (couponcenter.core.db.prepared) on a real PostgreSQL: a claim in
autocommit prepares its statement once per connection and reuses it; inside a transaction, or
turned off, it runs as plain SQL; a statement the server lost (a pooler, ``DEALLOCATE``) or
already has does not fail the claim."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from couponcenter.core.db.prepared import Prepared
from couponcenter.coupons import services, stock
from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.coupons.rules import ClaimRefused
from expiry.models import ExpiryTask
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def on_server(prefix: str) -> dict[str, tuple[int, int]]:
    """This session's prepared statements named ``prefix...``: (generic, custom) plans used."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE starts_with(name, %s)",
            [prefix],
        )
        return {name: (generic, custom) for name, generic, custom in cursor.fetchall()}


def claimed(coupon: Coupon) -> tuple[int, int, int]:
    coupon.refresh_from_db()
    rows = UserCoupon.objects.filter(coupon=coupon).count()
    tasks = ExpiryTask.objects.filter(user_coupon__coupon=coupon).count()
    return rows, tasks, coupon.claimed_count


def test_claims_prepare_their_statement_once_per_connection_and_reuse_its_plan():
    coupon = CouponFactory(total_stock=100)
    stock.stock_shards_ensure(coupon_id=coupon.pk)  # or the first claim waits for them
    for user_id in range(1, 11):
        services.coupon_claim(coupon_id=coupon.pk, user_id=user_id)
    statements = on_server("cc_claim")
    assert len(statements) == 1
    ((generic, custom),) = statements.values()
    # PostgreSQL plans the first five runs for their values, then keeps one plan.
    assert generic + custom == 10 and generic >= 1
    assert set(on_server("cc_fold")) and not on_server("cc_claim_wait")
    assert claimed(coupon) == (10, 10, 10)


def test_refusals_come_through_the_prepared_statement():
    coupon = CouponFactory(total_stock=2, per_user_limit=1)
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    with pytest.raises(ClaimRefused) as again:
        services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    assert again.value.code == "limit_reached"
    services.coupon_claim(coupon_id=coupon.pk, user_id=2)
    with pytest.raises(ClaimRefused) as sold_out:
        services.coupon_claim(coupon_id=coupon.pk, user_id=3)
    assert sold_out.value.code == "sold_out"
    assert on_server("cc_claim")
    assert claimed(coupon) == (2, 2, 2)


def test_a_statement_the_server_lost_runs_as_plain_sql_and_is_prepared_again():
    coupon = CouponFactory(total_stock=100)
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # as a pooler's reset would
    services.coupon_claim(coupon_id=coupon.pk, user_id=2)
    assert not on_server("cc_claim")  # that claim ran as plain SQL
    services.coupon_claim(coupon_id=coupon.pk, user_id=3)
    assert on_server("cc_claim")
    assert claimed(coupon) == (3, 3, 3)


def test_a_statement_the_session_has_already_is_used():
    # Behind a pooler in session mode a new client may get a server session that has it.
    coupon = CouponFactory(total_stock=100)
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    before = on_server("cc_claim")
    connection.prepared_statements.clear()
    services.coupon_claim(coupon_id=coupon.pk, user_id=2)
    assert set(on_server("cc_claim")) == set(before)
    assert claimed(coupon) == (2, 2, 2)


def test_a_new_connection_prepares_again():
    coupon = CouponFactory(total_stock=100)
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    connection.close()
    services.coupon_claim(coupon_id=coupon.pk, user_id=2)
    assert on_server("cc_claim")
    assert claimed(coupon) == (2, 2, 2)


def test_inside_a_transaction_nothing_is_prepared():
    coupon = CouponFactory(total_stock=100)
    with transaction.atomic():
        services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    assert not on_server("cc_")
    assert claimed(coupon) == (1, 1, 1)


def test_turned_off_nothing_is_prepared(settings):
    settings.DB_PREPARED_STATEMENTS = False
    coupon = CouponFactory(total_stock=100)
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    services.coupon_claim(coupon_id=coupon.pk, user_id=2)
    assert not on_server("cc_")
    assert claimed(coupon) == (2, 2, 2)


def test_connections_that_live_for_one_request_prepare_nothing():
    before = connection.settings_dict["CONN_MAX_AGE"]
    connection.settings_dict["CONN_MAX_AGE"] = 0
    try:
        coupon = CouponFactory(total_stock=100)
        services.coupon_claim(coupon_id=coupon.pk, user_id=1)
        assert not on_server("cc_")
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = before
    assert claimed(coupon) == (1, 1, 1)


def test_the_name_follows_the_text_and_the_types():
    one = Prepared("probe", "SELECT %(a)s::int", (("a", "integer"),))
    same = Prepared("probe", "SELECT %(a)s::int", (("a", "integer"),))
    other = Prepared("probe", "SELECT %(a)s::int + 1", (("a", "integer"),))
    retyped = Prepared("probe", "SELECT %(a)s::int", (("a", "bigint"),))
    assert one.key == same.key
    assert len({one.key, other.key, retyped.key}) == 3
    assert one.key.startswith("probe_")


@pytest.mark.parametrize(
    ("sql", "params", "message"),
    [
        ("SELECT %(a)s, %(b)s", (("a", "integer"),), "has no type"),
        ("SELECT 1", (("a", "integer"),), r"no %\(a\)s in the statement"),
        ("SELECT %(a)s %% 2", (("a", "integer"),), "a literal %"),
    ],
)
def test_a_statement_and_its_parameters_must_match(sql, params, message):
    with pytest.raises(ValueError, match=message):
        Prepared("probe", sql, params)
