"""Shared fixtures: a real Redis (``REDIS_URL`` or the embedded server) with a key prefix per test.

Tests never flush a Redis database they did not create: each test gets its own key prefix
(``settings.REDIS_KEY_PREFIX``) and deletes exactly the keys under it afterwards.
"""

import os
import threading
import uuid

import pytest
from django.db import connection

from couponcenter.celery import app as celery_app
from couponcenter.core import urgency
from couponcenter.core.redis import get_redis, is_cluster
from couponcenter.coupons import gate
from expiry.services import expiry_settings_cache_clear
from reminders.selectors import reminder_settings_cache_clear
from tests.support.settings_rows import reminder_settings_row

# Under CI=1 (``.ci/run``) every test must run: a skip (no browser, no cluster, no PostgreSQL) is a
# failure, and the suite refuses to start on anything but PostgreSQL.
STRICT = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_configure(config):
    if STRICT and not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise pytest.UsageError("CI=1 runs on PostgreSQL only: set DATABASE_URL=postgres://...")
    # Embedded Redis for a laptop with nothing installed: start it before any test imports a client.
    if not os.environ.get("REDIS_URL"):
        from couponcenter.core.redis import ensure_embedded_server

        ensure_embedded_server()


def pytest_collection_modifyitems(config, items):
    on_postgres = connection.vendor == "postgresql"
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://... (CI does)")
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip_pg)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=1, where every test must run: {reason}"


@pytest.fixture
def redis_client():
    return get_redis()


@pytest.fixture(autouse=True)
def redis_prefix(settings, redis_client):
    """A fresh key prefix for this test; its keys are deleted afterwards."""
    prefix = f"cctest-{uuid.uuid4().hex[:12]}"
    settings.REDIS_KEY_PREFIX = prefix
    yield prefix
    delete_keys(redis_client, f"{prefix}:*")


@pytest.fixture(autouse=True)
def gate_builds_joined(redis_prefix):
    """A claim that found no gate rebuilds it in a thread of its own (``gate.gate_build_soon``):
    it ends before the test's keys are deleted and its database flushed, which would otherwise
    deadlock with its reads."""
    yield
    for thread in threading.enumerate():
        if thread.name.startswith(gate.BUILD_THREAD_PREFIX):
            thread.join(timeout=60)


def delete_keys(client, pattern: str) -> None:
    if is_cluster(client):
        for node in client.get_primaries():
            keys = list(client.scan_iter(match=pattern, count=1000, target_nodes=node))
            for key in keys:
                client.delete(key)
        return
    batch = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


@pytest.fixture
def on_postgres():
    return connection.vendor == "postgresql"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test databases, plus one chore at the end: the live server's request
    threads keep persistent connections (``CONN_MAX_AGE``) that nothing closes, and PostgreSQL
    refuses to drop a database with sessions on it. End them before the drop."""
    yield
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def fresh_live_settings():
    """No live settings row cached from another test's database (each process keeps the row
    for a moment; a test must read its own)."""
    reminder_settings_cache_clear()
    expiry_settings_cache_clear()
    urgency.signal.clear()  # nor another test's reading of the urgent paths
    yield
    reminder_settings_cache_clear()
    expiry_settings_cache_clear()
    urgency.signal.clear()


@pytest.fixture
def eager_celery():
    """Run Celery tasks in-process (the real task code, without a broker round trip)."""
    # The app reads Django's settings under the CELERY namespace: the key to set is the
    # namespaced one (Celery 5.6 reads ``task_always_eager`` from it, not from the plain key).
    before = celery_app.conf.task_always_eager
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    assert celery_app.conf.task_always_eager
    yield celery_app
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = before


@pytest.fixture
def reminder_settings(db):
    """The live settings row, with a helper to change it the way the admin does."""
    return reminder_settings_row()
