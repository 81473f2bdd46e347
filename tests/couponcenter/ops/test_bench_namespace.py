"""A benchmark's namespace leaves nothing behind on the broker it shares."""

import kombu
import pytest

from couponcenter.celery import app as celery_app
from couponcenter.core.redis import broker_client
from couponcenter.ops.bench.namespace import bench_namespace


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
