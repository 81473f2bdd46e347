"""Fixtures for the engine tests: a real Redis (standalone from tests/conftest.py, and a real
3-master Redis Cluster on loopback ports started for the session), leases and a fixed clock."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from reminders.engine import keys, scripts
from tests.conftest import delete_keys

NOW = 1_750_000_000_000  # a fixed "now" in ms; scripts take time as an argument


def _free_port() -> int:
    """A port that is free along with its cluster bus port (+10000), both below Linux's ephemeral
    range (32768 up), so an outgoing connection cannot take one between the check and the start."""
    for _ in range(200):
        port = random.randrange(10_000, 22_000)
        try:
            for candidate in (port, port + 10_000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def redis_cluster():
    """A real 3-master Redis Cluster (no replicas) in a temp dir; yields a RedisCluster client."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not server or not cli:
        pytest.skip("redis-server / redis-cli not on PATH: cannot start a Redis Cluster")
    tmp = Path(tempfile.mkdtemp(prefix="cc-cluster-"))
    procs: list[subprocess.Popen] = []
    try:
        for attempt in range(3):  # another suite on the machine may grab a port we picked
            ports = [_free_port() for _ in range(3)]
            procs = [_node(server, tmp / f"{attempt}-{port}", port) for port in ports]
            try:
                for port, proc in zip(ports, procs, strict=True):
                    _wait(lambda p=port, n=proc: n.poll() is None and _ping(cli, p), 10,
                          f"redis-server on {port}")  # fmt: skip
                break
            except RuntimeError:
                _stop(procs)
                if attempt == 2:
                    raise
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for port in ports:
            _wait(lambda p=port: "cluster_state:ok" in _info(cli, p), 30, "cluster_state:ok")
        client = RedisCluster(host="127.0.0.1", port=ports[0], socket_timeout=10)
        _wait(lambda: len(client.get_primaries()) == 3, 10, "3 primaries")
        yield client
        client.close()
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def _node(server: str, node_dir: Path, port: int) -> subprocess.Popen:
    node_dir.mkdir()
    return subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
         "--cluster-config-file", "nodes.conf", "--dir", str(node_dir), "--save", "",
         "--appendonly", "no", "--protected-mode", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _ping(cli: str, port: int) -> bool:
    out = subprocess.run([cli, "-p", str(port), "ping"], capture_output=True, text=True, timeout=5)
    return out.stdout.strip() == "PONG"


def _info(cli: str, port: int) -> str:
    args = [cli, "-p", str(port), "cluster", "info"]
    return subprocess.run(args, capture_output=True, text=True, timeout=5).stdout


@pytest.fixture
def cluster_client(redis_cluster, redis_prefix):
    """The session cluster; this test's keys (under its prefix) are deleted afterwards."""
    yield redis_cluster
    delete_keys(redis_cluster, f"{redis_prefix}:*")


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def client(request, redis_client):
    """The engine's Redis: the configured standalone one, then the real 3-master cluster."""
    if request.param == "standalone":
        return redis_client
    return request.getfixturevalue("cluster_client")


@pytest.fixture
def now() -> int:
    return NOW


@pytest.fixture
def lease(client):
    """``lease(topic, slot)`` -> a fresh fencing token for that slot (ttl 60 s)."""

    def take(topic: str, slot: int = 0, holder: str = "test", ttl_ms: int = 60_000) -> str:
        token = scripts.lease_acquire(client, keys.slot_keys(topic, slot), holder=holder,
                                      ttl_ms=ttl_ms)  # fmt: skip
        assert token is not None, "slot lease already held"
        return token

    return take


class Space:
    """Reads a slot's keyspace for assertions: members and scores of store, prepare, dead, meta."""

    def __init__(self, client, topic: str, slot: int = 0):
        self.client, self.k = client, keys.slot_keys(topic, slot)

    def _zset(self, key: str) -> dict[str, int]:
        return {m.decode(): int(s) for m, s in self.client.zrange(key, 0, -1, withscores=True)}

    @property
    def store(self) -> dict[str, int]:
        return self._zset(self.k.store)

    @property
    def prepare(self) -> dict[str, int]:
        return self._zset(self.k.prepare)

    @property
    def dead(self) -> dict[str, int]:
        return self._zset(self.k.dead)

    @property
    def meta(self) -> dict[str, str]:
        return {f.decode(): v.decode() for f, v in self.client.hgetall(self.k.meta).items()}

    @property
    def parcels(self) -> dict[str, str]:
        return {f.decode(): v.decode() for f, v in self.client.hgetall(self.k.parcels).items()}


@pytest.fixture
def space(client):
    return lambda topic, slot=0: Space(client, topic, slot)
