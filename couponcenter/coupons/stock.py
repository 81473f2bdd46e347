"""Stock shards: a coupon's stock cut into ``COUPON_STOCK_SHARDS`` rows (``CouponStockShard``).

Every claim holds the row lock of the stock it takes from until its commit is durable, so with one
counter per coupon the claims of a popular coupon run one commit at a time. With the stock cut
into shards, a claim takes a unit from a random shard that still has stock and is not locked by
another claim (``services.coupon_claim``), and only waits when every such shard is busy.

Invariants (held by row locks and a check constraint, not by luck):
- ``claimed <= stock`` on every shard, and ``sum(stock) == total_stock`` for an active coupon, so
  ``sum(claimed)``, the number of claims, never exceeds ``total_stock``.
- shards are re-cut (stock moved between them) only by ``coupon_update`` / ``coupon_cancel``,
  with the coupon row and every shard row locked: a claim in flight either commits first or
  re-checks ``claimed < stock`` on the re-cut row. A cancelled coupon's shards are closed
  (``stock = claimed``).
- ``Coupon.claimed_count`` is a fold of ``sum(claimed)``: set exactly under those locks, and
  raised to the shards' sum after claims commit (in a transaction of its own,
  ``coupon_claimed_count_fold``). A fold never lowers it, so racing folds cannot move it back.
  Not every claim folds (``claimed_count_folding``): a claim that returns while another claim of
  the same coupon is still running in its process leaves the fold to that one, which folds after
  its own commit, unless this process's last fold of the coupon is ``COUPON_FOLD_INTERVAL_MS``
  old. So the count is exact once the claims of the coupon running in a process have all
  returned, and during a sale it trails the claims by at most that interval plus one claim.
- the row locks are taken in one order, coupon row (``FOR NO KEY UPDATE``, which leaves the key
  share lock of a claim's foreign key check free) then shards by number, so they never deadlock.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import Error as DbError
from django.db import connection, transaction
from django.db.models import Count, F, OuterRef, Subquery, Sum

from couponcenter.core.db import prepared

from .models import Coupon, CouponStockShard

logger = logging.getLogger(__name__)


def shard_count() -> int:
    return max(1, settings.COUPON_STOCK_SHARDS)


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal whole parts, the larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def stock_shards_create(*, coupon: Coupon, claimed: int = 0) -> list[CouponStockShard]:
    """Cut a coupon's stock into shards; ``claimed`` claims made already are spread over them."""
    n = shard_count()
    parts = zip(split(claimed, n), split(coupon.total_stock - claimed, n), strict=True)
    return CouponStockShard.objects.bulk_create(
        CouponStockShard(coupon_id=coupon.pk, shard=i, stock=done + left, claimed=done)
        for i, (done, left) in enumerate(parts)
    )


def stock_shards_ensure(*, coupon_id: int) -> None:
    """Shard a coupon written without ``services.coupon_create`` (fixtures, bulk loads, coupons
    from before the shards): its ``claimed_count`` so far counts as claimed."""
    with transaction.atomic():
        coupon = Coupon.objects.select_for_update(no_key=True).get(pk=coupon_id)
        if not CouponStockShard.objects.filter(coupon_id=coupon_id).exists():
            shards = stock_shards_create(
                coupon=coupon, claimed=min(coupon.claimed_count, coupon.total_stock)
            )
            if coupon.status == Coupon.Status.CANCELLED:
                stock_close(shards=shards)


def stock_left(*, coupon_id: int) -> int:
    """The units left over the coupon's shards, as committed now (a coupon without shards is
    sharded first)."""
    left = CouponStockShard.objects.filter(coupon_id=coupon_id).aggregate(
        n=Count("id"), left=Sum(F("stock") - F("claimed"))
    )
    if not left["n"]:
        stock_shards_ensure(coupon_id=coupon_id)
        return stock_left(coupon_id=coupon_id)
    return left["left"] or 0


def stock_lock(*, coupon: Coupon) -> list[CouponStockShard]:
    """In the caller's transaction, with the coupon row locked: lock every shard of the coupon
    (creating them if missing) and set ``coupon.claimed_count`` (in memory) to the exact count."""
    shards = _locked(coupon.pk)
    if not shards:
        stock_shards_create(coupon=coupon, claimed=min(coupon.claimed_count, coupon.total_stock))
        shards = _locked(coupon.pk)
    coupon.claimed_count = sum(shard.claimed for shard in shards)
    return shards


def _locked(coupon_id: int) -> list[CouponStockShard]:
    return list(
        CouponStockShard.objects.select_for_update().filter(coupon_id=coupon_id).order_by("shard")
    )


def stock_recut(*, coupon: Coupon, shards: list[CouponStockShard]) -> None:
    """Spread the stock left (``total_stock`` minus the claims) evenly over the locked shards."""
    numbers = {shard.shard for shard in shards}
    missing = [i for i in range(shard_count()) if i not in numbers]
    if missing:
        shards = shards + CouponStockShard.objects.bulk_create(
            CouponStockShard(coupon_id=coupon.pk, shard=i) for i in missing
        )
    left = coupon.total_stock - sum(shard.claimed for shard in shards)
    for shard, part in zip(shards, split(left, len(shards)), strict=True):
        shard.stock = shard.claimed + part
    CouponStockShard.objects.bulk_update(shards, ["stock"])


def stock_close(*, shards: list[CouponStockShard]) -> None:
    """No stock left in any shard: claims in flight find ``claimed < stock`` false."""
    for shard in shards:
        shard.stock = shard.claimed
    CouponStockShard.objects.bulk_update(shards, ["stock"])


def coupon_claimed_count_fold(*, coupon_id: int) -> None:
    """Raise ``claimed_count`` to the shards' count of claims (never lower it: folds may race).

    Run after claims (``claimed_count_folding``), in its own transaction. Outside a caller's
    transaction on PostgreSQL that transaction commits without waiting for its WAL flush
    (``synchronous_commit`` off for it alone), so the coupon row is locked for microseconds, not for
    an fsync, and claims do not queue behind each other's folds. The count is derived data: if a
    crash loses the last folds, the next fold (any claim, stock change or cancel) restores it from
    the shards, which are durable with their claims.
    """
    if connection.vendor == "postgresql":
        asynchronous = not connection.in_atomic_block
        with connection.cursor() as cursor:
            prepared.execute(
                cursor,
                _fold_prepared(asynchronous),
                {"coupon_id": coupon_id, "local": asynchronous},
            )
        return
    claims = Subquery(
        CouponStockShard.objects.filter(coupon_id=OuterRef("pk"))
        .values("coupon_id")
        .annotate(n=Sum("claimed"))
        .values("n")
    )
    Coupon.objects.filter(pk=coupon_id, claimed_count__lt=claims).update(claimed_count=claims)


class _Folds:
    """This process's claims of one coupon: how many are running, whether one committed since
    the last fold began, and when that fold began."""

    __slots__ = ("running", "dirty", "folded_at")

    def __init__(self) -> None:
        self.running, self.dirty, self.folded_at = 0, False, 0.0


class ClaimOutcome:
    committed = False


_folds_lock = threading.Lock()
_folds: dict[int, _Folds] = {}


@contextmanager
def claimed_count_folding(*, coupon_id: int) -> Iterator[ClaimOutcome]:
    """Around one claim in autocommit: set ``outcome.committed`` once it committed; on the way
    out, fold ``claimed_count`` if no other claim of the coupon is running in this process (that
    one will fold after its commit) or the last fold is ``COUPON_FOLD_INTERVAL_MS`` old."""
    outcome = ClaimOutcome()
    with _folds_lock:
        folds = _folds.get(coupon_id)
        if folds is None:
            if len(_folds) >= 10_000:
                # Safe even for running claims: each still folds through its own entry.
                _folds.clear()
            folds = _folds[coupon_id] = _Folds()
        folds.running += 1
    try:
        yield outcome
    finally:
        now = time.monotonic()
        with _folds_lock:
            folds.running -= 1
            folds.dirty = folds.dirty or outcome.committed
            due = folds.dirty and (
                folds.running == 0
                or now - folds.folded_at >= settings.COUPON_FOLD_INTERVAL_MS / 1000
            )
            if due:
                folds.dirty, folds.folded_at = False, now
        if due:
            try:
                coupon_claimed_count_fold(coupon_id=coupon_id)
            except DbError:  # InterfaceError too (a connection closed under us)
                with _folds_lock:
                    folds.dirty = True
                # The claims are committed; the count catches up at the next fold.
                logger.warning("coupon %s: claimed_count fold failed", coupon_id, exc_info=True)


# One statement, so one transaction in autocommit: set_config(..., is_local => true) changes
# synchronous_commit for this transaction only (inside a caller's transaction it is left alone).
_FOLD_SQL = """
WITH claims AS (
    SELECT SUM(claimed) AS n FROM {shard} WHERE coupon_id = %(coupon_id)s
), mode AS (
    SELECT CASE WHEN %(local)s THEN set_config('synchronous_commit', '{sync}', true) END
)
UPDATE {coupon} SET claimed_count = claims.n FROM claims, mode
WHERE id = %(coupon_id)s AND claimed_count < claims.n
"""


@functools.cache
def _fold_prepared(asynchronous: bool) -> prepared.Prepared:
    sql = _FOLD_SQL.format(
        coupon=connection.ops.quote_name(Coupon._meta.db_table),
        shard=connection.ops.quote_name(CouponStockShard._meta.db_table),
        sync="off" if asynchronous else "on",
    )
    name = "cc_fold_async" if asynchronous else "cc_fold"
    return prepared.Prepared(name, sql, (("coupon_id", "bigint"), ("local", "boolean")))
