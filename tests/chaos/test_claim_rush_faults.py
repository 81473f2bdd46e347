"""Chaos: faults in the middle of a claim rush, against real processes (issue 27, "Faults").

A real gunicorn (2 gthread workers x 8 threads) on the test database and the test's Redis
prefix; a pool of client threads (``tests/chaos/rush.py``) claims one coupon for distinct users,
some of them more often than the per-user limit allows, retrying through the fault. The faults:

- the test's Redis keys deleted, twice (what a FLUSHDB does to us: the tests share a Redis
  database, each under its own key prefix);
- a gunicorn worker SIGKILLed while its claims are inside PostgreSQL: the test holds every
  stock shard of the coupon locked, waits until every client is stuck and claims queue on that
  lock, kills the worker owning the most of them, and only then lets them go on (their commits
  land with no web process to answer);
- PostgreSQL stopped for 10 s and started again: a private cluster of the test's own (the shared
  server on 5432 is never stopped), with a copy of the test database;
- the coupon cancelled during its rush, and another one's stock raised during its rush.

After each one (``_verdicts``): winners never exceed the stock (rows and shards), no user is over
the limit, every 201 a client received is a row of that user, the units taken are exactly the rows
(claimed + left == stock), every claim got a final answer, and the units left sell to fresh
users (none lost). Bad input answers a 4xx and reserves nothing.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import psycopg2
import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from couponcenter.core.redis import get_redis
from couponcenter.coupons import accounts, services
from couponcenter.coupons.bench.http import Gunicorn, database_url, server_env
from couponcenter.coupons.models import Coupon, CouponStockShard, UserCoupon
from tests.chaos.faults import PrivatePostgres
from tests.chaos.rush import Rush, Sale, assert_sale_exact, claimers, sale_of, statuses
from tests.conftest import delete_keys
from tests.e2e.conftest import WEB_READY_TIMEOUT_S, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]
slow = pytest.mark.slow

RUSH_USER = 1_000_000  # the rush's users: 1_000_000 on
FRESH_USER = 9_000_000  # the users buying what a rush left
OUTAGE_S = 10


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def caller(transactional_db) -> str:
    """The token of a service account that claims for any user (the clients' caller)."""
    _, token = accounts.account_ensure(username="rush-clients", act_for_any_user=True)
    return token


@pytest.fixture
def web(redis_prefix):
    """Start gunicorn on this test's database (or ``DATABASE_URL=...``) and Redis prefix."""
    started: list[Gunicorn] = []

    def start(**env: str) -> Gunicorn:
        server = Gunicorn(workers=2, worker_class="gthread", threads=8,
                          env=server_env(THROTTLE_CLAIM="1000000000/min", **env))  # fmt: skip
        started.append(server)
        began = time.monotonic()
        server.wait_ready(timeout=WEB_READY_TIMEOUT_S)
        print(f"gunicorn ready in {time.monotonic() - began:.1f} s")
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def private_postgres():
    """A PostgreSQL cluster of the test's own, which it may stop (``faults.PrivatePostgres``)."""
    # Not under pytest's tmp_path: the server runs as the postgres user, who may not enter it.
    pg = PrivatePostgres(Path(tempfile.mkdtemp(prefix="cc-rush-pg-")))
    if not pg.available:
        pytest.skip("needs the PostgreSQL server binaries (initdb, pg_ctl)")
    try:
        yield pg
    finally:
        pg.close()


def _coupon(*, stock: int, limit: int = 1) -> Coupon:
    return services.coupon_create(
        name="Rush",
        claim_opens_at=timezone.now() - timedelta(minutes=1),
        total_stock=stock,
        per_user_limit=limit,
        valid_for=timedelta(days=1),
    )


def _rush(server: Gunicorn, token: str, coupon: Coupon, users: list[int]) -> Rush:
    return Rush(port=server.port, token=token, coupon_id=coupon.pk, users=users).start()


def _took(rush: Rush) -> str:
    return f"{len(rush.answers)} claims in {rush.ended - rush.began:.1f} s"


# --- the verdicts after every fault ---------------------------------------------------------------


def _verdicts(*, server: Gunicorn, token: str, rush: Rush, dsn: str,
              sell_out: bool = True) -> Sale:  # fmt: skip
    """The exactness rules, then (``sell_out``) fresh users claim what the rush left: every unit
    sells, so none was lost to a fault."""
    answers, coupon_id = rush.answers, rush.coupon_id
    sale = sale_of(dsn, coupon_id)
    print(f"{_took(rush)}: {dict(statuses(answers))}; {len(sale.rows)} rows")
    assert_sale_exact(sale, answers)
    # The reconcile also gives back the holds of a killed worker's requests; the sell-out below
    # needs those units back.
    assert_gate_consistent(coupon_id=coupon_id, dsn=dsn, sale=sale)
    if not sell_out:
        return sale
    rest = sale.total_stock - len(sale.rows)
    fresh = list(range(FRESH_USER, FRESH_USER + rest + 8))
    more = Rush(port=server.port, token=token, coupon_id=coupon_id, users=fresh).start().join()
    after = sale_of(dsn, coupon_id)
    assert_sale_exact(after, answers + more)
    assert len(after.rows) == after.total_stock, (
        f"units lost: {after.total_stock - len(after.rows)} never sold ({statuses(more)})"
    )
    assert statuses(more) == Counter({201: rest, "409 sold_out": 8}), statuses(more)
    return after


def assert_gate_consistent(*, coupon_id: int, dsn: str, sale: Sale) -> None:
    """After a reconcile the gate agrees with PostgreSQL: ``taken`` is the units claimed, each
    user's count is that user's claims, and no hold is left.

    The reconcile is ``gate_build`` in a process on ``dsn`` (the private server's too),
    with ``GATE_HOLD_STALE_S`` at 0: the rush is over, so every hold left belongs to a request
    that will never settle it (a killed worker's).
    """
    script = (
        "from django.conf import settings\n"
        "from couponcenter.coupons import gate\n"
        "settings.GATE_HOLD_STALE_S = 0\n"
        f"print('built:', gate.gate_build(coupon_id={coupon_id}))\n"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=settings.BASE_DIR, env=server_env(DATABASE_URL=dsn), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "built: True" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-3000:]
    )
    redis, key = get_redis(), f"{settings.REDIS_KEY_PREFIX}:gate:{{{coupon_id}}}"
    taken = redis.hget(key, "taken")
    assert taken is not None and int(taken) == sale.shard_claimed, (taken, sale.shard_claimed)
    users = {int(u): int(n) for u, n in redis.hgetall(f"{key}:users").items() if int(n)}
    assert users == dict(sale.per_user())
    assert redis.zcard(f"{key}:held") == 0


# --- 1. Redis flushed -----------------------------------------------------------------------------


@slow
def test_redis_flushed_twice_mid_rush(web, caller, redis_client, redis_prefix, rng):
    coupon = _coupon(stock=1000, limit=2)
    server = web()
    # 1,500 users for 1,000 units; 200 of them try a third claim past their limit of 2.
    users = claimers(users=1500, repeaters=200, repeats=3, first_user=RUSH_USER, rng=rng)
    rush = _rush(server, caller, coupon, users)
    flushed = []
    for fraction in (0.25, 0.5):
        rush.wait_answered(int(len(users) * fraction))
        keys = sum(1 for _ in redis_client.scan_iter(match=f"{redis_prefix}:*", count=1000))
        delete_keys(redis_client, f"{redis_prefix}:*")
        flushed.append((keys, rush.answered))
    rush.join()

    assert all(keys for keys, _ in flushed), f"a flush found nothing to delete: {flushed}"
    assert flushed[-1][1] < len(users), "the flushes came after the rush"
    _verdicts(server=server, token=caller, rush=rush, dsn=database_url())


# --- 2. a worker SIGKILLed while its claims commit ------------------------------------------------


@contextlib.contextmanager
def _shards_locked(dsn: str, coupon_id: int):
    """Every stock shard of the coupon locked by a transaction of the test's until the exit;
    yields that transaction's backend pid."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT id FROM {CouponStockShard._meta.db_table} WHERE coupon_id = %s"
                " ORDER BY shard FOR UPDATE",
                [coupon_id],
            )
            assert cur.rowcount == CouponStockShard.objects.filter(coupon_id=coupon_id).count()
            cur.execute("SELECT pg_backend_pid()")
            yield cur.fetchone()[0]
    finally:
        conn.rollback()
        conn.close()


def _claims_behind(dsn: str, locker: int, server: Gunicorn) -> dict[int, list[int]]:
    """{gunicorn worker pid: [its PostgreSQL backends waiting behind the ``locker``'s locks]},
    a backend matched to its worker by the backend's client port."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT pid, client_port, pg_blocking_pids(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        waiting = {pid: (port, set(blockers)) for pid, port, blockers in cur.fetchall()}
    # Directly behind the locker, or queued behind a backend that is (a row lock's queue).
    behind = {locker}
    while more := {p for p, (_, by) in waiting.items() if p not in behind and by & behind}:
        behind |= more
    ports = {waiting[p][0]: p for p in behind - {locker}}
    owners: dict[int, list[int]] = {}
    for worker in server.worker_pids():
        with contextlib.suppress(psutil.Error):
            for sock in psutil.Process(worker).net_connections(kind="tcp"):
                if sock.laddr and sock.laddr.port in ports:
                    owners.setdefault(worker, []).append(ports[sock.laddr.port])
    return owners


# Claims queued inside PostgreSQL once every client is stuck on the lock, one statement each: at
# least 8 (12 connections over 2 workers of 8 threads). Claims committed in groups queue fewer
# statements (one per group), so past QUEUE_S the kill goes ahead with the claims queued by then.
QUEUED_ONE_EACH, QUEUE_S = 8, 10


def _claims_queued(rush: Rush, dsn: str, locker: int, server: Gunicorn) -> dict[int, list[int]]:
    """Wait until every client's request is stuck (each is a claim, each claim needs a shard) and
    claims queue on the lock inside PostgreSQL; ``_claims_behind``'s answer."""
    full_by = time.monotonic() + QUEUE_S
    deadline = full_by + 120
    while True:
        owners = _claims_behind(dsn, locker, server)
        queued = sum(len(backends) for backends in owners.values())
        if (
            owners
            and rush.all_waiting
            and (queued >= QUEUED_ONE_EACH or time.monotonic() > full_by)
        ):
            return owners
        assert time.monotonic() < deadline, f"no claim queued on the shards' locks: {owners}"
        time.sleep(0.05)  # a poll of pg_stat_activity


def _database_ports(worker: int, dsn: str) -> set[int]:
    """The local ports of a worker's connections to the database server."""
    server_port = urlsplit(dsn).port or 5432
    return {
        sock.laddr.port
        for sock in psutil.Process(worker).net_connections(kind="tcp")
        if sock.raddr and sock.raddr.port == server_port
    }


def _backends_of(dsn: str, ports: set[int]) -> int:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND client_port = ANY(%s)",
            [list(ports)],
        )
        return cur.fetchone()[0]


@slow
def test_worker_sigkilled_while_its_claims_commit(web, caller, rng):
    coupon = _coupon(stock=1000)
    server = web()
    users = claimers(users=1500, repeaters=300, repeats=2, first_user=RUSH_USER, rng=rng)
    dsn = database_url()
    rush = _rush(server, caller, coupon, users)
    rush.wait_answered(len(users) // 3)

    with _shards_locked(dsn, coupon.pk) as locker:
        owners = _claims_queued(rush, dsn, locker, server)
        victim, backends = max(owners.items(), key=lambda item: len(item[1]))
        ports = _database_ports(victim, dsn)
        process = psutil.Process(victim)  # before the kill: its master reaps it at once
        process.send_signal(signal.SIGKILL)
        gone, _ = psutil.wait_procs([process], timeout=30)
        assert gone, f"worker {victim} survived its SIGKILL"
        at_kill = rush.answered
    # The killed worker's claims go on inside PostgreSQL, with nobody left to answer; the audit
    # waits for the last of them.
    wait_for(lambda: not _backends_of(dsn, ports), timeout=120, interval=0.1,
             what=f"the killed worker's database sessions to end ({len(ports)})")  # fmt: skip
    answers = rush.join()

    assert at_kill < len(users), "the kill came after the rush"
    cut = [a for a in answers if any(not f.isdigit() for f in a.failures)]
    assert cut, "no client lost a request to the kill"
    wait_for(lambda: len(server.worker_pids()) == 2, timeout=120, what="a worker in its place")
    assert victim not in server.worker_pids() and server.proc.poll() is None
    sale = _verdicts(server=server, token=caller, rush=rush, dsn=dsn)
    print(f"killed worker {victim} with {len(backends)} claims in PostgreSQL; "
          f"{len(cut)} requests cut; {len(sale.rows)} rows")  # fmt: skip


# --- 3. PostgreSQL down for 10 s ------------------------------------------------------------------


def _copy_database(source: str, pg: PrivatePostgres, name: str) -> None:
    """The test database (schema and rows: the coupon, the caller's token) on the private
    server, so its gunicorn serves the same sale."""
    admin = psycopg2.connect(pg.url("postgres"))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    dump = subprocess.run(
        [str(pg.bin / "pg_dump"), "--no-owner", "--no-privileges", "-d", source],
        capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    subprocess.run(
        [str(pg.bin / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-d", pg.url(name)],
        input=dump.stdout, capture_output=True, check=True, timeout=120,
    )  # fmt: skip


@slow
def test_postgres_down_10s_mid_rush(private_postgres, web, caller, rng):
    pg = private_postgres
    coupon = _coupon(stock=1000)
    began = time.monotonic()
    pg.init().start()
    started = time.monotonic()
    _copy_database(database_url(), pg, "cc")
    print(f"private PostgreSQL: initdb + start {started - began:.1f} s, "
          f"copy of the test database {time.monotonic() - started:.1f} s")  # fmt: skip
    dsn = pg.url("cc")
    server = web(DATABASE_URL=dsn)
    users = claimers(users=1500, repeaters=300, repeats=2, first_user=RUSH_USER, rng=rng)
    rush = _rush(server, caller, coupon, users)
    rush.wait_answered(len(users) // 3)

    pg.stop()
    at_stop = rush.answered
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(dsn, connect_timeout=2).close()  # really down
    time.sleep(OUTAGE_S)  # the outage itself, not a wait for something
    pg.start()
    answers = rush.join()

    assert at_stop < len(users), "the outage came after the rush"
    failed = Counter(f for a in answers for f in a.failures)
    assert failed, "no client saw the outage"
    _verdicts(server=server, token=caller, rush=rush, dsn=dsn)
    print(f"attempts that failed during the outage: {dict(failed)}")


# --- 4. the coupon changed during its rush --------------------------------------------------------


@slow
def test_coupon_cancelled_mid_rush(web, caller, rng):
    coupon = _coupon(stock=1000)
    server = web()
    users = claimers(users=1500, repeaters=300, repeats=2, first_user=RUSH_USER, rng=rng)
    rush = _rush(server, caller, coupon, users)
    rush.wait_answered(len(users) // 4)

    services.coupon_cancel(coupon=coupon)
    cancelled_at = time.monotonic()
    rows_at_cancel = UserCoupon.objects.filter(coupon=coupon).count()
    answers = rush.join()

    assert rows_at_cancel < coupon.total_stock, "sold out before the cancel"
    late = [a for a in answers if a.sent_at > cancelled_at]
    assert late, "the cancel came after the rush"
    assert all(a.status == 409 and a.code == "cancelled" for a in late), statuses(late)
    sale = _verdicts(server=server, token=caller, rush=rush, dsn=database_url(), sell_out=False)
    assert sale.cancelled and len(sale.rows) == rows_at_cancel, "a claim won after the cancel"


@slow
def test_stock_raised_mid_rush(web, caller, rng):
    coupon = _coupon(stock=600)
    server = web()
    users = claimers(users=1500, repeaters=300, repeats=2, first_user=RUSH_USER, rng=rng)
    rush = _rush(server, caller, coupon, users)
    rush.wait_answered(len(users) // 4)

    services.coupon_update(coupon=coupon, total_stock=1200)
    rows_at_raise = UserCoupon.objects.filter(coupon=coupon).count()
    rush.join()

    assert rows_at_raise < 600, "sold out before the raise"
    assert rush.answered == len(users)
    sale = _verdicts(server=server, token=caller, rush=rush, dsn=database_url())
    assert sale.total_stock == 1200 and len(sale.rows) == 1200


# --- bad input: a clear 4xx, never a reservation --------------------------------------------------

END_USER = 501


@pytest.fixture
def last_unit(transactional_db) -> Coupon:
    """A coupon with one unit left: a bad request that reserved it would leave nothing to sell."""
    return _coupon(stock=1)


def _post(token: str, user_id: int, coupon_id: int, **headers: str):
    return Client().post(
        f"/api/users/{user_id}/coupons/",
        data=json.dumps({"coupon": coupon_id}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {token}",
        **headers,
    )


def _sells_its_last_unit(token: str, coupon: Coupon, user_id: int) -> None:
    answer = _post(token, user_id, coupon.pk)
    assert answer.status_code == 201, answer.content
    assert list(UserCoupon.objects.filter(coupon=coupon).values_list("user_id", flat=True)) == [
        user_id
    ]


def test_unknown_coupon_is_404_and_reserves_nothing(caller, last_unit, redis_client, redis_prefix):
    unknown = last_unit.pk + 1000
    answer = _post(caller, END_USER, unknown)
    assert answer.status_code == 404, answer.content
    gate = f"{redis_prefix}:gate:{{{unknown}}}"  # the keys a gate of that id would have
    assert not redis_client.exists(gate, f"{gate}:users", f"{gate}:held"), "a gate for nothing"
    assert not UserCoupon.objects.exists()
    _sells_its_last_unit(caller, last_unit, END_USER)


def test_user_the_caller_may_not_act_for_is_403_and_reserves_nothing(last_unit):
    _, token = accounts.account_ensure(username="rush-one-user", end_user_id=END_USER)
    answer = _post(token, END_USER + 1, last_unit.pk)
    assert answer.status_code == 403, answer.content
    assert not UserCoupon.objects.exists()
    _sells_its_last_unit(token, last_unit, END_USER)


@pytest.mark.parametrize(
    "key", ["", "k" * 256, "caf\u00e9", "tab\there", "del\x7f"],
    ids=["empty", "too-long", "non-ascii", "control", "del"],
)  # fmt: skip
def test_malformed_idempotency_key_is_400_and_reserves_nothing(caller, last_unit, key):
    answer = _post(caller, END_USER, last_unit.pk, HTTP_IDEMPOTENCY_KEY=key)
    assert answer.status_code == 400, answer.content
    assert not UserCoupon.objects.exists()
    _sells_its_last_unit(caller, last_unit, END_USER)
