"""A benchmark's namespace leaves nothing behind on the broker it shares."""

import os
import subprocess
import sys

import kombu
import psutil
import pytest
from django.conf import settings

from couponcenter.celery import app as celery_app
from couponcenter.core.redis import broker_client, get_redis
from reminders.bench.namespace import bench_namespace


def _keys_naming(client, name: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"*{name}*", count=1000))


def test_the_delivery_queue_and_its_bindings_are_gone_from_the_broker_afterwards():
    client = broker_client()
    if client is None:
        pytest.skip("needs a Redis broker")
    said: list[str] = []
    with bench_namespace(lambda: None, said.append) as (_prefix, queue):
        # What the bench's Celery worker and the reminder worker do with it: the queue declared
        # and bound (kombu keeps the bindings in keys of their own), a message waiting in it.
        with celery_app.connection_for_write() as conn:
            bound = kombu.Queue(queue, kombu.Exchange(queue), routing_key=queue)(
                conn.default_channel
            )
            bound.declare()
            producer = kombu.Producer(conn.default_channel)
            producer.publish({"left": "behind"}, exchange=queue, routing_key=queue)
        during = _keys_naming(client, queue)
        assert queue.encode() in during  # the message's list
        assert any(key.startswith(b"_kombu.binding.") for key in during)
    assert _keys_naming(client, queue) == []
    assert said == []


# A run that holds its namespace with a key under its prefix and its queue declared and bound,
# then waits to be killed: what ``bench_days`` or ``bench_day`` is when an OOM killer strikes.
HOLDER = """
import sys, django
django.setup()
import kombu
from couponcenter.celery import app
from couponcenter.core.redis import get_redis
from reminders.bench.namespace import bench_namespace

with bench_namespace(lambda: None, print) as (prefix, queue):
    get_redis().set(f"{prefix}:held", "1")
    with app.connection_for_write() as conn:
        kombu.Queue(queue, kombu.Exchange(queue), routing_key=queue)(conn.default_channel).declare()
    print(prefix, queue, flush=True)
    sys.stdin.read()  # until killed
"""


def test_a_run_killed_outright_has_its_keys_and_queue_deleted_by_the_guard():
    client = broker_client()
    if client is None:
        pytest.skip("needs a Redis broker")
    env = {
        **os.environ,
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "DJANGO_SETTINGS_MODULE": "couponcenter.settings",
    }
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=settings.BASE_DIR, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        prefix, queue = proc.stdout.readline().decode().split()
        guard = [
            child
            for child in psutil.Process(proc.pid).children()
            if "namespace_guard" in " ".join(child.cmdline())
        ]
        assert len(guard) == 1
        assert get_redis().get(f"{prefix}:held") == b"1"
        assert any(key.startswith(b"_kombu.binding.") for key in _keys_naming(client, queue))
    finally:
        proc.kill()  # no finally of the run's runs
        proc.wait()
    # The guard, in a session of its own, outlives the run; it ends once it has deleted them
    # (not its child: psutil cannot read its exit status, only wait for its end).
    guard[0].wait(timeout=60)
    assert get_redis().get(f"{prefix}:held") is None
    assert _keys_naming(client, queue) == []
