"""Grouped claim commits (couponcenter.coupons.claim_groups) on real PostgreSQL: claims of one
coupon running together commit in one statement, never past the stock or a user's limit, a row that
fails fails alone, and a database error reaches every claim of the group."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.db.backends.signals import connection_created
from django.utils import timezone

from couponcenter.core.time import utc_text
from couponcenter.coupons import claim_groups, services, stock
from couponcenter.coupons.claim_groups import SEQ_TAKEN, Claim, claim_grouped, claims_commit
from couponcenter.coupons.models import Coupon, CouponStockShard, UserCoupon
from couponcenter.coupons.rules import ClaimRefused
from expiry.models import ExpiryTask
from tests.couponcenter.test_claim_concurrency import free_connections
from tests.support.factories import CouponFactory
from tests.support.plans import scans

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 12


@pytest.fixture(autouse=True)
def grouping(settings):
    """Groups that close when full (a long wait otherwise), so threads started together group."""
    settings.CLAIM_GROUP_MAX = 6
    settings.CLAIM_GROUP_WAIT_MS = 300
    claim_groups.claims_per_statement.clear()
    if free_connections() < THREADS + 10:
        pytest.skip("not enough free PostgreSQL connections for the claimers")


def run_claimers(coupon_id: int, work: list[list[tuple[int, int]]]) -> list:
    """Each thread claims (user_id, seq) after (user_id, seq) of its list, all threads starting
    together; returns every outcome: the UserCoupon, the refusal code, or the database error."""
    start = threading.Barrier(len(work))

    def claimer(jobs: list[tuple[int, int]]) -> list:
        outcomes = []
        start.wait()
        try:
            for user_id, seq in jobs:
                try:
                    outcomes.append(
                        claim_grouped(
                            coupon_id=coupon_id, user_id=user_id, seq=seq, now=timezone.now()
                        )
                    )
                except ClaimRefused as exc:
                    outcomes.append(exc.code)
                except DatabaseError as exc:
                    outcomes.append(exc)
        finally:
            connections.close_all()
        return outcomes

    with ThreadPoolExecutor(max_workers=len(work)) as pool:
        futures = [pool.submit(claimer, jobs) for jobs in work]
        # A claim left waiting for a group that never decides it would hang here: fail instead.
        return [outcome for future in futures for outcome in future.result(timeout=60)]


def kinds(outcomes: list) -> Counter:
    return Counter("ok" if isinstance(o, UserCoupon) else o for o in outcomes)


def claims(*users: int, seq: int = 1, now=None) -> list[Claim]:
    now = now or timezone.now()
    return [Claim(user_id=user_id, seq=seq, now=now) for user_id in users]


def outcome_codes(group: list[Claim]) -> list:
    """What each claim of a group came to: "ok", SEQ_TAKEN, or the refusal's code."""
    codes = []
    for claim in group:
        assert claim.done.is_set()
        outcome = claim.outcome
        if isinstance(outcome, UserCoupon):
            codes.append("ok")
        elif isinstance(outcome, ClaimRefused):
            codes.append(outcome.code)
        else:
            codes.append(outcome)
    return codes


def assert_rows_of(coupon: Coupon, committed: list[UserCoupon]) -> None:
    """Every returned user coupon is a row with its expiry task, and there are no others."""
    rows = UserCoupon.objects.filter(coupon=coupon)
    assert sorted(rows.values_list("pk", flat=True)) == sorted(uc.pk for uc in committed)
    for user_coupon in committed:
        row = rows.get(pk=user_coupon.pk)
        assert (row.user_id, row.seq, row.expires_at) == (
            user_coupon.user_id,
            user_coupon.seq,
            user_coupon.expires_at,
        )
        assert user_coupon.coupon.name == coupon.name
    tasks = ExpiryTask.objects.filter(user_coupon__coupon=coupon)
    assert sorted(tasks.values_list("user_coupon_id", flat=True)) == sorted(
        uc.pk for uc in committed
    )


def test_threads_claiming_one_coupon_commit_in_groups_and_never_past_the_stock():
    coupon = CouponFactory(total_stock=50, per_user_limit=1)
    users = list(range(1, 81))
    work = [[(user_id, 1) for user_id in users[i::THREADS]] for i in range(THREADS)]

    outcomes = run_claimers(coupon.pk, work)

    assert kinds(outcomes) == Counter(ok=50, sold_out=30)
    assert max(claim_groups.claims_per_statement) > 1
    committed = [o for o in outcomes if isinstance(o, UserCoupon)]
    assert_rows_of(coupon, committed)
    assert len({uc.user_id for uc in committed}) == 50
    # The last claim out folded the count: it is exact once they all returned.
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 50
    claimed = CouponStockShard.objects.filter(coupon=coupon).values_list("claimed", flat=True)
    assert sum(claimed) == 50


def test_a_taken_seq_fails_alone_and_its_claim_takes_the_next_free_seq_or_is_refused():
    coupon = CouponFactory(total_stock=100, per_user_limit=2)
    services.coupon_claim(coupon_id=coupon.pk, user_id=2)  # user 2's seq 1
    services.coupon_claim(coupon_id=coupon.pk, user_id=3)
    services.coupon_claim(coupon_id=coupon.pk, user_id=3)  # user 3 is at the limit
    group = claims(1, 2, 3, 4)

    claims_commit(coupon_id=coupon.pk, claims=group)

    assert outcome_codes(group) == ["ok", SEQ_TAKEN, SEQ_TAKEN, "ok"]
    assert claim_groups.claims_per_statement == Counter({4: 1})
    # Through claim_grouped the taken seq goes on alone: the next free one, or limit_reached.
    retried = claim_grouped(coupon_id=coupon.pk, user_id=2, seq=1, now=timezone.now())
    assert (retried.user_id, retried.seq) == (2, 2)
    with pytest.raises(ClaimRefused) as refused:
        claim_grouped(coupon_id=coupon.pk, user_id=3, seq=1, now=timezone.now())
    assert refused.value.code == "limit_reached"
    seqs = UserCoupon.objects.filter(coupon=coupon).values_list("user_id", "seq")
    assert sorted(seqs) == [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1)]
    assert ExpiryTask.objects.filter(user_coupon__coupon=coupon).count() == 6


def test_a_seq_past_the_limit_and_a_repeated_seq_in_one_group_go_alone():
    coupon = CouponFactory(total_stock=100, per_user_limit=1)
    group = [*claims(1, 1), *claims(2, seq=2)]

    claims_commit(coupon_id=coupon.pk, claims=group)

    assert outcome_codes(group) == ["ok", SEQ_TAKEN, SEQ_TAKEN]
    assert sorted(UserCoupon.objects.filter(coupon=coupon).values_list("user_id", "seq")) == [
        (1, 1)
    ]


def test_a_groups_statement_reads_no_user_coupon_whatever_the_statistics_say():
    """Seen in bench_rush on a new database: the group's statement was planned while the user
    coupon table was empty, and its check of each row's seq became a hash of the coupon's user
    coupons, read in full by every statement. The generic plan a web process keeps lives as long
    as its connection, so the rush slowed as the table grew. The statement must not read the
    table at all: a seq taken meanwhile is the insert's conflict, whatever the table's size."""
    statement = claim_groups._group_prepared(False)
    probe = "PREPARE plan_probe" + statement._prepare.removeprefix(f"PREPARE {statement.key}")
    now = timezone.now()
    values = {
        "coupon_id": 1,
        "user_ids": [1, 2],
        "seqs": [1, 1],
        "ats": [now, now],
        "keys": [None, None],
        "start": 0,
        "active": Coupon.Status.ACTIVE,
        "unused": UserCoupon.Status.UNUSED,
        "pending": ExpiryTask.Status.PENDING,
    }
    params = [values[name] for name, _ in statement.params]
    table = UserCoupon._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")  # empty: the statistics of a new database
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute(probe)
            placeholders = ", ".join(["%s"] * len(params))
            cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE plan_probe({placeholders})", params)
            plan = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE ALL")
            cursor.execute("RESET plan_cache_mode")
    connection.prepared_statements.clear()  # DEALLOCATE ALL dropped them on the server

    assert {kind for kind, relation in scans(plan) if relation == table} == {"ModifyTable"}, plan


def test_repeated_claims_of_users_in_threads_stay_within_their_limit():
    coupon = CouponFactory(total_stock=1000, per_user_limit=2)
    # Each of 6 users claims 4 times with the same seq 1, from different threads at once.
    work = [[(user_id, 1) for user_id in range(1, 7)] for _ in range(4)] + [
        [(user_id, 1)] for user_id in range(7, 7 + THREADS - 4)
    ]

    outcomes = run_claimers(coupon.pk, work)

    per_user = Counter(UserCoupon.objects.filter(coupon=coupon).values_list("user_id", flat=True))
    assert per_user == Counter({user_id: 2 for user_id in range(1, 7)}) + Counter(
        range(7, 7 + THREADS - 4)
    )
    assert kinds(outcomes) == Counter(ok=12 + THREADS - 4, limit_reached=12)
    assert_rows_of(coupon, [o for o in outcomes if isinstance(o, UserCoupon)])


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        # Moments taken when the test runs, not when the module is collected.
        (lambda now: {"status": Coupon.Status.CANCELLED}, "cancelled"),
        (lambda now: {"claim_opens_at": now + timedelta(hours=1)}, "not_open"),
        (lambda now: {"claim_closes_at": now - timedelta(seconds=1)}, "closed"),
    ],
    ids=["cancelled", "not_open", "closed"],
)
def test_a_coupon_that_cannot_be_claimed_refuses_the_whole_group(fields, code):
    coupon = CouponFactory(total_stock=100, **fields(timezone.now()))
    group = claims(1, 2, 3)

    claims_commit(coupon_id=coupon.pk, claims=group)

    assert outcome_codes(group) == [code] * 3
    if code == "not_open":
        assert group[0].outcome.extra["opens_at"] == utc_text(coupon.claim_opens_at)
    assert not UserCoupon.objects.filter(coupon=coupon).exists()


def _waiting_on_a_lock(deadline_s: float = 60) -> None:
    """Return once another session waits on a lock (the only one that can: the claims')."""
    deadline = time.monotonic() + deadline_s
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("no claim statement came to wait on the shards' locks")


def test_a_cancel_committing_while_the_group_waits_for_a_shard_answers_cancelled():
    """The cancel closes the shards under their locks; a group that read the coupon as active
    and then found the closed shards is refused ``cancelled``, not ``sold_out`` (which the gate
    would learn and answer for a coupon that never sold out)."""
    coupon = services.coupon_create(
        name="Cancelled", claim_opens_at=timezone.now(), total_stock=10, valid_for=timedelta(1)
    )
    locked, commit = threading.Event(), threading.Event()

    def cancel_held_open() -> None:
        try:
            with transaction.atomic():
                row = Coupon.objects.select_for_update(no_key=True).get(pk=coupon.pk)
                stock.stock_close(shards=stock.stock_lock(coupon=row))
                row.status = Coupon.Status.CANCELLED
                row.save(update_fields=["status"])
                locked.set()
                assert commit.wait(60)
        finally:
            connections.close_all()

    group = claims(1, 2, 3)
    with ThreadPoolExecutor(max_workers=2) as pool:
        cancel = pool.submit(cancel_held_open)
        assert locked.wait(60)
        commit_group = pool.submit(claims_commit, coupon_id=coupon.pk, claims=group)
        try:
            _waiting_on_a_lock()
        finally:
            commit.set()
        cancel.result(timeout=60)
        commit_group.result(timeout=60)

    assert outcome_codes(group) == ["cancelled"] * 3
    assert not UserCoupon.objects.filter(coupon=coupon).exists()


def test_each_claim_is_judged_at_its_own_moment():
    opens = timezone.now()
    coupon = CouponFactory(total_stock=100, claim_opens_at=opens)
    early = claims(1, now=opens - timedelta(milliseconds=1))
    group = [*early, *claims(2, now=opens)]

    claims_commit(coupon_id=coupon.pk, claims=group)

    assert outcome_codes(group) == ["not_open", "ok"]


def test_an_unknown_coupon_raises_does_not_exist_for_every_claim():
    group = claims(1, 2)

    claims_commit(coupon_id=987_654_321, claims=group)

    assert all(isinstance(claim.outcome, Coupon.DoesNotExist) for claim in group)
    assert group[0].outcome is not group[1].outcome


@pytest.mark.parametrize(("claimers", "winners"), [(7, 7), (14, 10)])
def test_a_shard_running_short_mid_group_still_commits_min_of_stock_and_claims(
    settings, claimers, winners
):
    settings.COUPON_STOCK_SHARDS = 4
    coupon = services.coupon_create(
        name="Flash", claim_opens_at=timezone.now(), total_stock=10, valid_for=timedelta(days=1)
    )
    group = claims(*range(1, claimers + 1))

    claims_commit(coupon_id=coupon.pk, claims=group)

    codes = outcome_codes(group)
    assert Counter(codes) == Counter({"ok": winners, "sold_out": claimers - winners})
    # No shard holds more than 3 units: the first statement could not take all the claims.
    assert claim_groups.claims_per_statement[claimers] == 1
    assert sum(claim_groups.claims_per_statement.values()) > 1
    assert_rows_of(coupon, [c.outcome for c in group if isinstance(c.outcome, UserCoupon)])
    shards = CouponStockShard.objects.filter(coupon=coupon).order_by("shard")
    assert sum(shards.values_list("claimed", flat=True)) == winners
    assert all(shard.claimed <= shard.stock for shard in shards)


def test_a_database_error_reaches_every_claim_of_the_group():
    coupon = services.coupon_create(
        name="Locked", claim_opens_at=timezone.now(), total_stock=100, valid_for=timedelta(days=1)
    )

    def short_statement_timeout(sender, connection, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 200")

    # Every shard is held by a transaction here: the claims find none free, then wait for one
    # until their statement times out.
    connection_created.connect(short_statement_timeout)
    try:
        with transaction.atomic():
            list(CouponStockShard.objects.select_for_update().filter(coupon=coupon))
            outcomes = run_claimers(coupon.pk, [[(user_id, 1)] for user_id in range(THREADS)])
    finally:
        connection_created.disconnect(short_statement_timeout)

    assert len(outcomes) == THREADS
    assert all(isinstance(outcome, DatabaseError) for outcome in outcomes), outcomes
    assert max(claim_groups.claims_per_statement) > 1
    assert len({id(outcome) for outcome in outcomes}) == THREADS
    assert not UserCoupon.objects.filter(coupon=coupon).exists()
    # The shards are free again: the same claims now commit.
    again = run_claimers(coupon.pk, [[(user_id, 1)] for user_id in range(THREADS)])
    assert kinds(again) == Counter(ok=THREADS)


def test_a_lone_claim_never_waits_for_a_group(settings):
    settings.CLAIM_GROUP_WAIT_MS = 600_000
    coupon = services.coupon_create(
        name="Alone", claim_opens_at=timezone.now(), total_stock=10, valid_for=timedelta(days=1)
    )

    outcomes = run_claimers(coupon.pk, [[(1, 1)]])

    assert kinds(outcomes) == Counter(ok=1)
    assert claim_groups.claims_per_statement == Counter({1: 1})


def test_inside_a_transaction_the_claim_runs_alone_in_it():
    coupon = CouponFactory(total_stock=10)
    with transaction.atomic():
        user_coupon = claim_grouped(coupon_id=coupon.pk, user_id=1, seq=1, now=timezone.now())
        transaction.set_rollback(True)

    assert user_coupon.seq == 1
    assert not claim_groups.claims_per_statement
    assert not UserCoupon.objects.filter(coupon=coupon).exists()
