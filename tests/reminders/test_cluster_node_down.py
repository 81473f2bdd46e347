"""One master of a Redis Cluster goes down, then comes back empty (no replica, no persistence:
the worst case), under the Django layer.

While it is down, a tick that needs it fails with the connection error (``run_forever`` logs
"tick failed" and tries again a second later; the worker registry and the singleton leases may
live on that master too, so without a replica the engine waits for it) and nothing is lost or
fired twice. Back empty, it has lost its entries; the rebuild from PostgreSQL (what the worker's
reconcile runs on a missing epoch marker) puts them back, and every job fires exactly once
(what a failed tick had claimed comes back after its visibility timeout). The cluster is this
test's own (the session's is shared), with ``cluster-require-full-coverage no`` so the healthy
masters keep answering.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from couponcenter.core.redis import get_redis, is_cluster
from reminders.engine import keys
from reminders.models import TimeoutJob
from reminders.runtime.worker import build_worker
from tests.e2e.conftest import wait_for
from tests.reminders import test_timeouts_handlers as handlers
from tests.reminders.engine import conftest as engine

pytestmark = [pytest.mark.django_db, pytest.mark.cluster]
topics, make_job, calls = handlers.topics, handlers.make_job, handlers.calls
TOPIC, SLOTS = "t.call", 8
ACTION = "tests.reminders.test_timeouts_handlers.record_call"


class Cluster:
    def __init__(self) -> None:
        self.server, self.cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if not self.server or not self.cli:
            pytest.skip("redis-server / redis-cli not on PATH: cannot start a Redis Cluster")
        self.tmp = Path(tempfile.mkdtemp(prefix="cc-cluster-down-"))
        self.ports = [engine._free_port() for _ in range(3)]
        self.procs = {p: engine._node(self.server, self.tmp / str(p), p) for p in self.ports}
        for port in self.ports:
            engine._wait(lambda p=port: engine._ping(self.cli, p), 10, f"redis-server on {port}")
        subprocess.run([self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)  # fmt: skip
        for port in self.ports:
            self._config(port)
            engine._wait(lambda p=port: "cluster_state:ok" in engine._info(self.cli, p), 30,
                         "cluster_state:ok")  # fmt: skip

    def _config(self, port: int) -> None:
        subprocess.run([self.cli, "-p", str(port), "config", "set",
                        "cluster-require-full-coverage", "no"],
                       check=True, capture_output=True, timeout=10)  # fmt: skip

    def port_of(self, key: str) -> int:
        client = RedisCluster(host="127.0.0.1", port=self.ports[0])
        try:
            return client.get_node_from_key(key).port
        finally:
            client.close()

    def kill(self, port: int) -> None:
        self.procs[port].kill()
        self.procs[port].wait(timeout=10)

    def restart_empty(self, port: int) -> None:
        """The same node (its nodes.conf, so its slots) with no data: a restart without
        persistence."""
        node_dir = self.tmp / str(port)
        self.procs[port] = subprocess.Popen(
            [self.server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf", "--dir", str(node_dir), "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        engine._wait(lambda: engine._ping(self.cli, port), 10, f"redis-server on {port}")
        self._config(port)
        for p in self.ports:
            engine._wait(lambda q=p: "cluster_state:ok" in engine._info(self.cli, q), 30,
                         "cluster_state:ok")  # fmt: skip

    def close(self) -> None:
        engine._stop(list(self.procs.values()))
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def own_cluster(settings):
    cluster = Cluster()
    settings.REDIS_URL = f"redis+cluster://127.0.0.1:{cluster.ports[0]}"
    assert is_cluster(get_redis())
    try:
        yield cluster
    finally:
        cluster.close()


def _drain():
    worker = build_worker([TOPIC])
    try:
        return worker.run_until_idle(max_ticks=20)
    finally:
        worker.shutdown()  # logs, does not raise, when a lease cannot be released


def test_a_master_down_then_back_empty_loses_no_job(own_cluster, topics, make_job, calls):
    topics(t_call={"type": "callable", "path": ACTION, "slots": SLOTS, "visibility_ms": 1000})
    jobs = [make_job(TOPIC, biz_id=f"N-{n}") for n in range(40)]
    node_of_slot = {s: own_cluster.port_of(keys.slot_keys(TOPIC, s).store) for s in range(SLOTS)}
    victim = node_of_slot[jobs[0].slot]
    lost_slots = {s for s, port in node_of_slot.items() if port == victim}
    assert lost_slots != set(range(SLOTS)), "the victim must not hold every slot"
    on_victim = [j for j in jobs if j.slot in lost_slots]
    elsewhere = [j for j in jobs if j.slot not in lost_slots]
    assert on_victim and elsewhere

    own_cluster.kill(victim)
    with pytest.raises(RedisError):  # reported, not swallowed: run_forever logs and retries
        _drain()
    fired = set(calls)
    assert not fired & {j.pk for j in on_victim}  # nothing of the dead master's slots fired
    assert TimeoutJob.objects.filter(status=TimeoutJob.Status.PROCESSED).count() == len(fired)

    own_cluster.restart_empty(victim)
    out = StringIO()
    call_command("rebuild_reminder_queues", stdout=out, stderr=StringIO())
    # Entries a failed tick claimed are in flight until their visibility timeout: observed.
    pending = TimeoutJob.objects.exclude(status=TimeoutJob.Status.PROCESSED)
    wait_for(lambda: _drain() is not None and not pending.exists(), timeout=60, interval=0.2,
             what=f"every job fired: {list(pending.values_list('pk', 'status'))}")  # fmt: skip
    assert sorted(calls) == sorted(j.pk for j in jobs)  # each once: none lost, none twice
    assert set(TimeoutJob.objects.values_list("status", flat=True)) == {TimeoutJob.Status.PROCESSED}
