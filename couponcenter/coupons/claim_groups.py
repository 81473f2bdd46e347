"""Grouped claim commits: the claims of one coupon running in one process at the same moment go to
PostgreSQL in one statement (a multi-row insert), and each caller waits for its own outcome.

At the opening of a popular coupon most claims are winners, and each costs a transaction and a
durable commit; one statement for a group of them costs one. ``claim_grouped`` is the claim that
takes its ``seq`` from the caller (the gate knows the user's claim number).

- No thread of its own: a claim joins the group forming for its coupon, and the first to join
  leads it. The leader waits up to ``CLAIM_GROUP_WAIT_MS`` for others to join (or until
  ``CLAIM_GROUP_MAX`` have) only while other claims run in this process, so a sync worker, one
  request at a time, never waits. It then runs the group on its own connection and hands each
  member its outcome.
- A failing row fails alone: a claim whose ``(coupon, user, seq)`` is taken (or whose seq is past
  the user's limit) goes by itself through ``services.claim_one``, which finds the user's free seq
  or refuses ``limit_reached``; the others commit.
- A database error fails every claim of the group not committed yet with that error (the caller
  gives back what it reserved for the claim).
- The invariants are ``services``' and ``stock``'s, held the same way: one shard per statement,
  locked inside the server, ``claimed`` raised by the number of rows inserted (never past the
  shard's free units, and the check constraint backs it up), the unique seq per user.

PostgreSQL only. On SQLite, or inside a caller's transaction, a claim runs alone.
"""

from __future__ import annotations

import copy
import functools
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection

from couponcenter.core.db import prepared

# The one documented exception to the layering (docs/architecture.md, invariant 2): a claim
# writes its ExpiryTask in its own transaction.
from expiry.models import ExpiryTask

from . import gate, services, stock
from .models import Coupon, UserCoupon
from .rules import ClaimRefused


class SeqTaken:
    """A claim's outcome when its seq is taken or past the user's limit: it runs alone."""


SEQ_TAKEN = SeqTaken()


@dataclass(eq=False)
class Claim:
    """One claim of a group; ``outcome`` is set (then ``done``) once it is decided: the committed
    ``UserCoupon``, the exception to raise (a refusal, an unknown coupon, a database error),
    ``SEQ_TAKEN`` or ``NO_GATE``. A ``gated`` claim asks the gate first: its ``seq`` and ``hold``
    come from the gate's pass."""

    user_id: int
    seq: int | None
    now: datetime
    idempotency_key: str | None = None
    gated: bool = False
    hold: str | None = None
    outcome: UserCoupon | BaseException | SeqTaken | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def settle(self, outcome: UserCoupon | BaseException | SeqTaken) -> None:
        self.outcome = outcome
        self.done.set()


class NoGate(Exception):
    """The gate had no answer for a gated claim (no gate for the coupon, Redis unreachable): the
    caller claims without it."""


NO_GATE = SeqTaken()  # a gated claim's outcome when the gate had no answer


class _Group:
    __slots__ = ("claims", "full")

    def __init__(self) -> None:
        self.claims: list[Claim] = []
        self.full = threading.Event()


_lock = threading.Lock()
_forming: dict[int, _Group] = {}
_running = 0
# How many statements carried how many claims, in this process (what the grouping achieves).
claims_per_statement: Counter[int] = Counter()


def claim_grouped(
    *,
    coupon_id: int,
    user_id: int,
    seq: int | None,
    now: datetime,
    idempotency_key: str | None = None,
    gated: bool = False,
) -> UserCoupon:
    """Claim ``coupon_id`` for ``user_id`` as its claim number ``seq``, committed with the claims
    of the coupon running beside it; raises ``ClaimRefused`` (``rules``) like
    ``services.coupon_claim``, ``Coupon.DoesNotExist`` for an unknown coupon, and the database's
    error when the group's statement fails.

    ``gated``: the group asks the gate for all its claims in one round trip first, and a claim
    takes the seq the gate's pass gives it; ``NoGate`` when the gate had no answer. The unit the
    gate held for a claim is settled once it committed and given back when it did not."""
    claim = Claim(user_id=user_id, seq=seq, now=now, idempotency_key=idempotency_key, gated=gated)
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        _alone(coupon_id=coupon_id, claim=claim)
    else:
        with stock.claimed_count_folding(coupon_id=coupon_id) as folding:
            _run_in_group(coupon_id=coupon_id, claim=claim)
            folding.committed = isinstance(claim.outcome, UserCoupon)
    return _finish(coupon_id=coupon_id, claim=claim)


def _alone(*, coupon_id: int, claim: Claim) -> None:
    """Decide one claim in statements of its own (SQLite, a caller's transaction)."""
    if claim.gated:
        _admit(coupon_id=coupon_id, claims=[claim])
    if claim.done.is_set():
        return
    try:
        claim.settle(_claim_one(coupon_id=coupon_id, claim=claim, seq=claim.seq))
    except Exception as exc:  # noqa: BLE001 - the claim's outcome, raised by _finish
        claim.settle(exc)
    _settle_holds(coupon_id=coupon_id, claims=[claim])


def _claim_one(*, coupon_id: int, claim: Claim, seq: int | None) -> UserCoupon:
    return services.claim_one(
        coupon_id=coupon_id,
        user_id=claim.user_id,
        seq=seq,
        now=claim.now,
        idempotency_key=claim.idempotency_key,
    )


def _finish(*, coupon_id: int, claim: Claim) -> UserCoupon:
    """The claim's answer in its own thread: a seq taken meanwhile runs alone, and the unit the
    gate held for a claim that did not commit goes back."""
    outcome = claim.outcome
    if outcome is NO_GATE:
        raise NoGate
    try:
        if outcome is SEQ_TAKEN:
            user_coupon = _claim_one(coupon_id=coupon_id, claim=claim, seq=None)
            if claim.hold is not None:
                gate.gate_settle(coupon_id=coupon_id, holds=[claim.hold])
            return user_coupon
        if isinstance(outcome, BaseException):
            raise outcome
    except BaseException as exc:
        if claim.hold is not None:
            _give_back(coupon_id=coupon_id, claim=claim, exc=exc)
        raise
    assert isinstance(outcome, UserCoupon)
    return outcome


def _give_back(*, coupon_id: int, claim: Claim, exc: BaseException) -> None:
    """The unit held for a claim that did not commit goes back; then PostgreSQL's refusal
    teaches the gate what it knows better (in this order, or the unit given back would undo the
    lesson)."""
    assert claim.hold is not None
    gate.gate_release(coupon_id=coupon_id, user_id=claim.user_id, hold=claim.hold)
    code = exc.code if isinstance(exc, ClaimRefused) else None
    if code == "sold_out":
        gate.gate_sold_out(coupon_id=coupon_id)
    elif code == "limit_reached":
        gate.gate_user_full(coupon_id=coupon_id, user_id=claim.user_id)


def _admit(*, coupon_id: int, claims: list[Claim]) -> None:
    """Ask the gate for ``claims`` in one round trip: a pass gives each its seq and hold; a
    refusal or no answer decides it."""
    answers = gate.gate_claim_many(
        coupon_id=coupon_id,
        claims=[(claim.user_id, gate.ms_of(claim.now)) for claim in claims],
    )
    for claim, answer in zip(claims, answers, strict=True):
        if isinstance(answer, gate.GatePass):
            claim.seq, claim.hold = answer.seq, answer.hold
        elif answer is None:
            claim.settle(NO_GATE)
        else:
            claim.settle(gate_refused(answer))


def gate_refused(refusal: gate.GateRefusal) -> ClaimRefused:
    """The gate's refusal as the claim's."""
    return services.claim_refused(
        refusal.code,
        opens_at=None if refusal.opens_ms is None else gate.moment_of(refusal.opens_ms),
        closed_at=None if refusal.closes_ms is None else gate.moment_of(refusal.closes_ms),
    )


def _settle_holds(*, coupon_id: int, claims: list[Claim]) -> None:
    """The gate forgets the holds of the claims that committed (one round trip)."""
    holds = [c.hold for c in claims if c.hold is not None and isinstance(c.outcome, UserCoupon)]
    gate.gate_settle(coupon_id=coupon_id, holds=holds)


def _run_in_group(*, coupon_id: int, claim: Claim) -> None:
    global _running
    with _lock:
        _running += 1
        group = _forming.get(coupon_id)
        leads = group is None
        if group is None:
            group = _forming[coupon_id] = _Group()
            others_running = _running > 1
        group.claims.append(claim)
        if len(group.claims) >= settings.CLAIM_GROUP_MAX:
            del _forming[coupon_id]
            group.full.set()
    try:
        if leads:
            _lead(coupon_id=coupon_id, group=group, wait=others_running)
        claim.done.wait()
    finally:
        with _lock:
            _running -= 1


def _lead(*, coupon_id: int, group: _Group, wait: bool) -> None:
    if wait:
        group.full.wait(settings.CLAIM_GROUP_WAIT_MS / 1000)
    with _lock:
        if _forming.get(coupon_id) is group:
            del _forming[coupon_id]
    # Closed: no claim joins it any more.
    claims = group.claims
    try:
        gated = [claim for claim in claims if claim.gated]
        if gated:
            _admit(coupon_id=coupon_id, claims=gated)
        claims_commit(coupon_id=coupon_id, claims=[c for c in claims if not c.done.is_set()])
        _settle_holds(coupon_id=coupon_id, claims=claims)
    except BaseException as exc:
        # Followers must never be left waiting: each one not decided yet gets the error.
        failure = exc if isinstance(exc, Exception) else RuntimeError(f"group leader: {exc!r}")
        for claim in claims:
            if not claim.done.is_set():
                claim.settle(_copy_of(failure))
        if failure is not exc:
            raise


def _copy_of(exc: Exception) -> Exception:
    """``exc`` for one member of the group: an object of its own (one exception raised in several
    threads at once would mix their tracebacks), with the same cause (the driver's error)."""
    try:
        own = copy.copy(exc)
    except Exception:
        return exc
    own.__cause__ = exc.__cause__ or exc
    return own


def claims_commit(*, coupon_id: int, claims: list[Claim]) -> None:
    """Decide ``claims`` of one coupon (settle each), one statement per round on this connection
    in autocommit; raises the database's error, leaving the claims not decided yet unsettled.

    Round after round, as a single claim's waits (``services``): the claims left over when the
    shard ran short go on from a random shard, skipping busy ones; when a round found no shard,
    the next waits for one, walking the shards from 0, and they are ``sold_out`` once no shard
    has stock left."""
    pending = _unique(claims)
    waits, wait = 0, False
    while pending:
        rows = _statement(coupon_id=coupon_id, claims=pending, wait=wait)
        pending, picked, unclaimable = _settle_round(coupon_id, pending, rows)
        if unclaimable:
            pending += _refuse(coupon_id=coupon_id, claims=unclaimable)
        if not pending or picked:
            wait = False
            continue
        waits += 1
        if waits > services._MAX_WAITS or not stock.stock_left(coupon_id=coupon_id):
            # The coupon is read after the shards: a cancel closes them in the transaction that
            # cancels the coupon, so closed shards read here come with the cancel.
            for claim in _refuse(coupon_id=coupon_id, claims=pending):
                claim.settle(services._refused("sold_out"))
            return
        wait = True


def _unique(claims: list[Claim]) -> list[Claim]:
    """The claims one statement can take: a second claim of one (user, seq) runs alone."""
    seen: set[tuple[int, int]] = set()
    unique = []
    for claim in claims:
        key = (claim.user_id, claim.seq)
        if key in seen:
            claim.settle(SEQ_TAKEN)
        else:
            seen.add(key)
            unique.append(claim)
    return unique


def _settle_round(
    coupon_id: int, claims: list[Claim], rows: list[tuple]
) -> tuple[list[Claim], bool, list[Claim]]:
    """Settle the claims a round decided; return those left for the next round, whether it
    found a shard, and those the coupon did not take (its window, its status)."""
    left, unclaimable, picked = [], [], False
    for ordinal, claimable, seq_in_limit, chosen, pk, expires_at, name in sorted(rows):
        claim = claims[ordinal - 1]
        picked = picked or chosen
        if pk is not None:
            claim.settle(
                services._claimed(
                    coupon_id=coupon_id,
                    coupon_name=name,
                    user_id=claim.user_id,
                    seq=claim.seq,
                    now=claim.now,
                    pk=pk,
                    expires_at=expires_at,
                    idempotency_key=claim.idempotency_key,
                )
            )
        elif not claimable:
            unclaimable.append(claim)
        elif chosen or not seq_in_limit:
            # Chosen and not inserted: another claim committed the same seq (or key) first.
            claim.settle(SEQ_TAKEN)
        else:
            left.append(claim)
    return left, picked, unclaimable


def _refuse(*, coupon_id: int, claims: list[Claim]) -> list[Claim]:
    """Refuse the claims the coupon did not take, each with its reason at its own moment; return
    those with none (the coupon changed since the statement read it)."""
    try:
        coupon = Coupon.objects.get(pk=coupon_id)
    except Coupon.DoesNotExist:
        for claim in claims:
            claim.settle(Coupon.DoesNotExist("Coupon matching query does not exist."))
        return []
    again = []
    for claim in claims:
        refusal = services._window_refusal(coupon=coupon, now=claim.now)
        if refusal:
            claim.settle(services._refused(refusal, coupon))
        else:
            again.append(claim)
    return again


# One statement, so one transaction in autocommit, as the single claim's (``services._CLAIM_SQL``,
# whose comments hold here too) but for many rows: each requested row (user, seq, moment) is
# checked against the coupon's window at its own moment and its seq against the user's limit; ONE
# shard with stock left is locked, and the rows that fit its free units are inserted (in key order,
# so two groups with rows in common never wait on each other in a cycle), the shard raised by
# exactly the number inserted, and their expiry tasks written. A row whose seq (or idempotency key)
# is taken is skipped (ON CONFLICT DO NOTHING), not an error for the whole group: it then runs
# alone, which finds the user's free seq or the user coupon with its key. The statement reads no
# user coupon row to find a taken seq: the insert's conflict check is an index probe whatever the
# plan, where a lookup of its own was planned by the table's statistics, and a web process keeps
# the plan for its connection's life (one made on an empty table read every user coupon of the
# coupon, statement after statement). The answer has one row per requested row, by its ordinal.
_GROUP_SQL = """
WITH coupon AS (
    SELECT id, name, claim_opens_at, claim_closes_at, expires_at, valid_for, per_user_limit
    FROM {coupon} WHERE id = %(coupon_id)s AND status = %(active)s
), request AS (
    SELECT r.ordinal, r.user_id, r.seq, r.at, r.idempotency_key,
        COALESCE(c.expires_at, r.at + c.valid_for) AS expires_at,
        COALESCE(c.claim_opens_at <= r.at
            AND (c.claim_closes_at IS NULL OR c.claim_closes_at > r.at)
            AND (c.expires_at IS NULL OR c.expires_at > r.at), false) AS claimable,
        r.seq BETWEEN 1 AND c.per_user_limit AS seq_in_limit
    FROM unnest(
        %(user_ids)s::bigint[], %(seqs)s::integer[], %(ats)s::timestamptz[], %(keys)s::text[]
    ) WITH ORDINALITY AS r(user_id, seq, at, idempotency_key, ordinal)
    LEFT JOIN coupon c ON true
), ready AS (
    SELECT *, row_number() OVER (ORDER BY ordinal) AS n FROM request
    WHERE claimable AND seq_in_limit
), pick AS (
    SELECT s.id, s.stock - s.claimed AS free FROM {shard} s
    WHERE s.coupon_id = %(coupon_id)s AND s.claimed < s.stock AND EXISTS (SELECT 1 FROM ready)
    ORDER BY s.shard < %(start)s, s.shard
    LIMIT 1 FOR UPDATE OF s {skip_locked}
), chosen AS (
    SELECT ready.* FROM ready, pick WHERE ready.n <= pick.free
), claimed AS (
    INSERT INTO {user_coupon}
        (coupon_id, user_id, seq, status, claimed_at, expires_at, idempotency_key)
    SELECT %(coupon_id)s, user_id, seq, %(unused)s, at, expires_at, idempotency_key FROM chosen
    ORDER BY user_id, seq
    ON CONFLICT DO NOTHING
    RETURNING id, user_id, seq, claimed_at, expires_at
), taken AS (
    UPDATE {shard} s SET claimed = s.claimed + (SELECT count(*) FROM claimed)
    FROM pick WHERE s.id = pick.id AND EXISTS (SELECT 1 FROM claimed)
), task AS (
    INSERT INTO {task} (user_coupon_id, expire_at, status, created_at, updated_at)
    SELECT id, expires_at, %(pending)s, claimed_at, claimed_at FROM claimed
)
SELECT r.ordinal, r.claimable, r.seq_in_limit, chosen.ordinal IS NOT NULL,
    claimed.id, claimed.expires_at, c.name
FROM request r
LEFT JOIN chosen ON chosen.ordinal = r.ordinal
LEFT JOIN claimed ON claimed.user_id = r.user_id AND claimed.seq = r.seq
LEFT JOIN coupon c ON true
"""


def _statement(*, coupon_id: int, claims: list[Claim], wait: bool) -> list[tuple]:
    params = {
        "coupon_id": coupon_id,
        "user_ids": [claim.user_id for claim in claims],
        "seqs": [claim.seq for claim in claims],
        "ats": [claim.now for claim in claims],
        "keys": [claim.idempotency_key for claim in claims],
        "start": 0 if wait else random.randrange(stock.shard_count()),
        "active": Coupon.Status.ACTIVE,
        "unused": UserCoupon.Status.UNUSED,
        "pending": ExpiryTask.Status.PENDING,
    }
    with _lock:
        claims_per_statement[len(claims)] += 1
    with connection.cursor() as cursor:
        prepared.execute(cursor, _group_prepared(wait), params)
        return cursor.fetchall()


@functools.cache
def _group_prepared(wait: bool) -> prepared.Prepared:
    return prepared.Prepared(
        "cc_claim_group_wait" if wait else "cc_claim_group",
        services._claim_sql(_GROUP_SQL, wait=wait),
        (
            ("coupon_id", "bigint"),
            ("user_ids", "bigint[]"),
            ("seqs", "integer[]"),
            ("ats", "timestamptz[]"),
            ("keys", "text[]"),
            ("start", "integer"),
            ("active", "text"),
            ("unused", "text"),
            ("pending", "text"),
        ),
    )
