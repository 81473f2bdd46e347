"""Against a real 3-master Redis Cluster: one hash tag per slot, scripts reloaded after a flush,
a dispatcher spreading work over the nodes. (test_scripts / test_queue / test_leases also run
every core case on the cluster through the parametrized ``client`` fixture.)"""

import pytest

from reminders.engine import queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.engine.dispatcher import Dispatcher
from reminders.engine.keys import slot_for, slot_keys
from reminders.engine.topic_model import OK, Topic

pytestmark = pytest.mark.cluster
T = "coupon.reminder"


def test_all_keys_of_a_slot_share_one_cluster_keyslot(cluster_client):
    for slot in range(32):
        k = slot_keys(T, slot)
        names = [k.store, k.prepare, k.dead, k.meta, k.lease, k.fence, k.parcels, k.later]
        assert len({cluster_client.keyslot(name) for name in names}) == 1
        node = cluster_client.get_node_from_key(k.store)
        assert cluster_client.execute_command("CLUSTER KEYSLOT", k.fence, target_nodes=node) == \
            cluster_client.keyslot(k.store)  # fmt: skip


def test_slots_spread_over_the_three_masters(cluster_client):
    nodes = {cluster_client.get_node_from_key(slot_keys(T, s).store).name for s in range(64)}
    assert len(nodes) == 3


def flush_scripts(client) -> None:
    client.execute_command("SCRIPT FLUSH", target_nodes=client.ALL_NODES)
    assert not any(client.script_exists(scripts.ENQUEUE.sha))


def test_scripts_come_back_after_a_script_flush(cluster_client, now):
    queue.schedule_many(
        T, [(f"j{i}", now, slot_for(i, 8)) for i in range(100)], client=cluster_client
    )
    flush_scripts(cluster_client)
    # pipelined (run_calls) and single calls both fall back to SCRIPT LOAD on NOSCRIPT
    assert queue.schedule_many(T, [(f"k{i}", now, slot_for(i, 8)) for i in range(100)],
                               client=cluster_client) == 100  # fmt: skip
    flush_scripts(cluster_client)
    assert queue.cancel(T, "k1", slot=slot_for(1, 8), client=cluster_client) == "store"
    flush_scripts(cluster_client)
    assert queue.reap(T, range(8), now_ms=now, limit=5, max_attempts=3, client=cluster_client) == \
        scripts.ReapResult(0, 0)  # fmt: skip


def test_a_dispatcher_drains_every_node(cluster_client):
    items = [(f"j{i}", epoch_ms() - 5, slot_for(i, 16)) for i in range(2000)]
    queue.schedule_many(T, items, client=cluster_client)
    seen = []

    def handler(entries):
        seen.extend(e.job_id for e in entries)
        return [OK] * len(entries)

    dispatcher = Dispatcher([Topic(T, handler, slots=16, batch_size=300)], client=cluster_client)
    report = dispatcher.run_until_idle()
    dispatcher.shutdown()
    assert report.acked == 2000 and sorted(seen) == sorted(job for job, _, _ in items)
    stats = queue.stats(T, range(16), now_ms=epoch_ms(), client=cluster_client)
    assert sum(s.store + s.prepare + s.dead for s in stats) == 0
