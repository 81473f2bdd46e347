"""The PostgreSQL backend's health check (couponcenter.core.db.postgresql): a connection used in the
last DB_HEALTH_CHECK_IDLE_S is not checked before a request; if it broke meanwhile, one request
fails and the connection is replaced, as when it breaks during a request."""

from __future__ import annotations

import pytest
from django.core.signals import request_finished, request_started
from django.db import DatabaseError, connection, connections

from couponcenter.coupons.models import Coupon
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def request(work):
    """``work`` as a request: Django's connection handling around it."""
    request_started.send(sender=None)
    try:
        return work()
    finally:
        request_finished.send(sender=None)


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def terminate(pid: int) -> None:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


@pytest.fixture
def persistent(settings):
    before = dict(connection.settings_dict)
    connection.settings_dict.update(CONN_MAX_AGE=60, CONN_HEALTH_CHECKS=True)
    connection.close()
    yield settings
    connection.close()
    connection.settings_dict.update(before)


def test_a_recently_used_connection_is_not_checked_and_fails_once_if_broken(persistent):
    persistent.DB_HEALTH_CHECK_IDLE_S = 60
    CouponFactory.create_batch(3)
    pid = request(backend_pid)
    assert request(backend_pid) == pid  # persistent
    terminate(pid)
    with pytest.raises(DatabaseError):
        request(Coupon.objects.count)
    assert connection.connection is None  # closed at the end of the failed request
    assert request(Coupon.objects.count) == 3
    assert request(backend_pid) != pid


def test_an_idle_connection_is_checked_first(persistent):
    persistent.DB_HEALTH_CHECK_IDLE_S = 0
    CouponFactory.create_batch(2)
    pid = request(backend_pid)
    terminate(pid)
    assert request(Coupon.objects.count) == 2  # the check found it broken and reconnected
    assert request(backend_pid) != pid
