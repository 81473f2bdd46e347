"""The engine's Redis connection and key prefix, installed by whoever uses the engine.

As rq's ``Queue(connection=...)`` and BullMQ's ``QueueKeys(prefix)``, the engine is handed its
connection and key prefix; it imports no framework and no project module. The Django app installs
both from ``reminders/apps.py``: a client factory (the process-wide client, rebuilt after a fork)
and a prefix read at call time (tests give each test its own). Every engine function also accepts
``client=`` explicitly, which wins over the installed one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import redis
from redis.cluster import RedisCluster

Client: TypeAlias = redis.Redis | RedisCluster

DEFAULT_PREFIX = "cc"

_client_factory: Callable[[], Client] | None = None
_prefix: Callable[[], str] = lambda: DEFAULT_PREFIX  # noqa: E731


def install(*, client: Callable[[], Client], prefix: Callable[[], str] | str) -> None:
    """Give the engine its connection (a factory, called per use) and key prefix."""
    global _client_factory, _prefix
    _client_factory = client
    _prefix = prefix if callable(prefix) else (lambda: prefix)


def client(explicit: Client | None = None) -> Client:
    """``explicit`` if given, else the installed connection."""
    if explicit is not None:
        return explicit
    if _client_factory is None:
        raise RuntimeError("the engine has no connection: call reminders.engine.connection.install")
    return _client_factory()


def prefix() -> str:
    return _prefix()


def is_cluster(client: Client) -> bool:
    return isinstance(client, RedisCluster)
