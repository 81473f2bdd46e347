"""A claim rush against a real gunicorn, and the audit of the sale it made.

``Rush``: a pool of client threads, each with one keep-alive HTTP connection, claims one coupon
for a shuffled list of users (some of them more often than the coupon's per-user limit allows)
and records every answer. An attempt that gets no answer or a 5xx is retried after a short
back-off until the claim has a final answer (201 or 4xx), as a client of a sale would: a fault in
the middle of the rush then still ends with every claim answered once the service is back.
Without an idempotency key a retry may hide a claim that committed before its answer was lost;
the audit allows that (a row nobody was told about), never the converse.

``sale_of`` reads the sale straight from PostgreSQL (any server: the tests' own or a private
one) and ``assert_sale_exact`` checks the issue's exactness rules against it and the answers.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg2

from couponcenter.coupons.models import Coupon, CouponStockShard, UserCoupon
from expiry.models import ExpiryTask

CONNECTIONS = 12  # below gunicorn's 2 x 8 threads: a correctness test, not a benchmark
REQUEST_TIMEOUT_S = 120  # a claim may wait on a row lock the test holds
RETRY_FOR_S = 180  # how long a claim keeps retrying through a fault before it counts as lost
REFUSALS = {"sold_out", "limit_reached", "not_open", "closed", "cancelled"}


@dataclass
class Answer:
    """The final answer to one claim."""

    user_id: int
    status: int = 0  # 0: no HTTP answer until the retries gave up
    code: str = ""  # a 409's refusal code
    user_coupon_id: int | None = None  # a 201's
    body_user_id: int | None = None  # a 201's
    sent_at: float = 0.0  # time.monotonic() when the attempt that got this answer was sent
    failures: list[str] = field(default_factory=list)  # what each retried attempt got


def claimers(*, users: int, repeaters: int, repeats: int, first_user: int,
             rng: random.Random) -> list[int]:  # fmt: skip
    """``users`` distinct users claim once each, ``repeaters`` of them ``repeats`` times in all;
    shuffled, so some repeats run concurrently and some long after the first claim."""
    ids = list(range(first_user, first_user + users))
    order = ids + [u for u in rng.sample(ids, repeaters) for _ in range(repeats - 1)]
    rng.shuffle(order)
    return order


class Rush:
    """Claims ``coupon_id`` for each user of ``users`` over ``connections`` connections."""

    def __init__(self, *, port: int, token: str, coupon_id: int, users: list[int],
                 connections: int = CONNECTIONS) -> None:  # fmt: skip
        self.port, self.coupon_id = port, coupon_id
        self.body = json.dumps({"coupon": coupon_id}).encode()
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.answers = [Answer(user_id=u) for u in users]
        self._next = 0
        self._done = 0
        self._sending = 0
        self.began = self.ended = 0.0  # time.monotonic() at start and at the last answer
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._client, daemon=True, name=f"rush-{i}")
            for i in range(min(connections, len(users)))
        ]

    # --- control -----------------------------------------------------------------------------

    def start(self) -> Rush:
        self.began = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    @property
    def answered(self) -> int:
        with self._cond:
            return self._done

    @property
    def all_waiting(self) -> bool:
        """Whether every client has a request out (none between two, none backing off)."""
        with self._cond:
            return self._sending == len(self._threads)

    def wait_answered(self, count: int, *, timeout: float = 120) -> int:
        """Block until ``count`` claims have their final answer; returns how many have."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._done >= count, timeout=timeout):
                raise AssertionError(f"{self._done} of {count} claims answered after {timeout} s")
            return self._done

    def join(self, *, timeout: float = 300) -> list[Answer]:
        self.wait_answered(len(self.answers), timeout=timeout)
        for thread in self._threads:
            thread.join(timeout=10)
        return self.answers

    # --- the clients -------------------------------------------------------------------------

    def _take(self) -> Answer | None:
        with self._cond:
            if self._next >= len(self.answers):
                return None
            self._next += 1
            return self.answers[self._next - 1]

    def _client(self) -> None:
        conn = None
        while (answer := self._take()) is not None:
            deadline = time.monotonic() + RETRY_FOR_S
            backoff = 0.02
            while True:
                if conn is None:
                    conn = http.client.HTTPConnection(
                        "127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S
                    )
                answer.sent_at = time.monotonic()
                with self._cond:
                    self._sending += 1
                try:
                    status, data = self._post(conn, answer.user_id)
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    conn = None
                    status, data = 0, {}
                    answer.failures.append(type(exc).__name__)
                finally:
                    with self._cond:
                        self._sending -= 1
                if 0 < status < 500:
                    self._record(answer, status, data)
                    break
                if status:
                    answer.failures.append(str(status))
                if time.monotonic() >= deadline:
                    break  # status 0: never answered
                time.sleep(backoff)  # a client's back-off while the service is down
                backoff = min(backoff * 2, 0.5)
            with self._cond:
                self._done += 1
                if self._done == len(self.answers):
                    self.ended = time.monotonic()
                self._cond.notify_all()
        if conn is not None:
            conn.close()

    def _post(self, conn: http.client.HTTPConnection, user_id: int) -> tuple[int, dict]:
        conn.request("POST", f"/api/users/{user_id}/coupons/", body=self.body,
                     headers=self.headers)  # fmt: skip
        response = conn.getresponse()
        raw = response.read()
        data = {}
        if response.getheader("Content-Type", "").startswith("application/json"):
            with contextlib.suppress(ValueError):
                data = json.loads(raw)
        if response.getheader("Connection", "").lower() == "close":
            conn.close()  # reopened by the next request
        return response.status, data if isinstance(data, dict) else {}

    @staticmethod
    def _record(answer: Answer, status: int, data: dict) -> None:
        answer.status = status
        if status == 201:
            answer.user_coupon_id = data.get("id")
            answer.body_user_id = data.get("user_id")
        else:
            answer.code = str(data.get("code", ""))


def statuses(answers: list[Answer]) -> Counter:
    """{201: n, "409 sold_out": n, ...}: the final answers at a glance (for messages)."""
    return Counter(a.status if a.status != 409 else f"409 {a.code}" for a in answers)


# --- the audit ------------------------------------------------------------------------------------


@dataclass
class Sale:
    """A coupon's sale as PostgreSQL holds it."""

    total_stock: int
    per_user_limit: int
    cancelled: bool
    claimed_count: int  # the coupon row's derived count
    shards: int
    shard_stock: int  # sum of the shards' stock
    shard_claimed: int  # sum of the shards' claimed: the units taken
    shards_over: int  # shards with claimed > stock (the check constraint says none)
    rows: dict[int, tuple[int, int]]  # user coupon id -> (user_id, seq)
    rows_with_task: int

    @property
    def left(self) -> int:
        return self.shard_stock - self.shard_claimed

    def per_user(self) -> Counter:
        return Counter(user for user, _ in self.rows.values())


def sale_of(dsn: str, coupon_id: int) -> Sale:
    """Read the sale in one snapshot (REPEATABLE READ), so the counts agree with each other."""
    tables = {
        "coupon": Coupon._meta.db_table,
        "shard": CouponStockShard._meta.db_table,
        "uc": UserCoupon._meta.db_table,
        "task": ExpiryTask._meta.db_table,
    }
    with contextlib.closing(psycopg2.connect(dsn, connect_timeout=10)) as conn:
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        with conn.cursor() as cur:
            cur.execute(
                "SELECT total_stock, per_user_limit, status, claimed_count FROM {coupon}"
                " WHERE id = %s".format(**tables),
                [coupon_id],
            )
            total_stock, limit, status, claimed_count = cur.fetchone()
            cur.execute(
                "SELECT count(*), coalesce(sum(stock), 0), coalesce(sum(claimed), 0),"
                " count(*) FILTER (WHERE claimed > stock) FROM {shard}"
                " WHERE coupon_id = %s".format(**tables),
                [coupon_id],
            )
            shards, shard_stock, shard_claimed, over = cur.fetchone()
            cur.execute(
                "SELECT id, user_id, seq FROM {uc} WHERE coupon_id = %s".format(**tables),
                [coupon_id],
            )
            rows = {pk: (user, seq) for pk, user, seq in cur.fetchall()}
            cur.execute(
                "SELECT count(*) FROM {uc} uc JOIN {task} t ON t.user_coupon_id = uc.id"
                " WHERE uc.coupon_id = %s".format(**tables),
                [coupon_id],
            )
            (with_task,) = cur.fetchone()
        conn.rollback()
    return Sale(
        total_stock=total_stock,
        per_user_limit=limit,
        cancelled=status == Coupon.Status.CANCELLED,
        claimed_count=claimed_count,
        shards=shards,
        shard_stock=int(shard_stock),
        shard_claimed=int(shard_claimed),
        shards_over=over,
        rows=rows,
        rows_with_task=with_task,
    )


def assert_sale_exact(sale: Sale, answers: list[Answer]) -> None:
    """The issue's exactness rules, after a rush and whatever fault it met."""
    rows = len(sale.rows)
    # Winners never exceed the stock, counted both ways.
    assert rows <= sale.total_stock, f"oversold: {rows} rows for a stock of {sale.total_stock}"
    assert sale.shard_claimed <= sale.shard_stock and sale.shards_over == 0, sale
    # Units taken are exactly the rows: none lost to a claim that never committed, none extra.
    assert sale.shard_claimed == rows, f"{sale.shard_claimed} units taken for {rows} user coupons"
    if sale.cancelled:
        assert sale.left == 0, f"a cancelled coupon's shards keep {sale.left} units open"
    else:
        assert sale.shard_stock == sale.total_stock, (
            f"claimed {sale.shard_claimed} + left {sale.left} != stock {sale.total_stock}"
        )
    assert sale.claimed_count <= sale.shard_claimed, "the derived count ran ahead of the claims"
    # No user over the limit; each claim numbered within it.
    over = {u: n for u, n in sale.per_user().items() if n > sale.per_user_limit}
    assert not over, f"users over the limit of {sale.per_user_limit}: {over}"
    assert all(1 <= seq <= sale.per_user_limit for _, seq in sale.rows.values())
    assert sale.rows_with_task == rows, f"{rows - sale.rows_with_task} claims without expiry task"
    # Every claim got a final answer once the service was back: a 201 or a refusal.
    unanswered = [a for a in answers if a.status not in (201, 409)]
    assert not unanswered, f"{len(unanswered)} claims not answered 201/409: {unanswered[:5]}"
    assert {a.code for a in answers if a.status == 409} <= REFUSALS, statuses(answers)
    # Every 201 a client received is a row of that user, and no two 201s share a row.
    won = [a for a in answers if a.status == 201]
    missing = [a for a in won if sale.rows.get(a.user_coupon_id, (None,))[0] != a.user_id]
    assert not missing, f"{len(missing)} answered 201 without their row: {missing[:5]}"
    assert all(a.body_user_id == a.user_id for a in won)
    assert len({a.user_coupon_id for a in won}) == len(won), "two 201s for one user coupon"
