"""Loading the Lua scripts and running them, one at a time or many in a pipeline.

Each script lives in ``reminders/engine/lua/<name>.lua`` with a header naming its KEYS, ARGV and
return values; a line ``-- @include <fragment>`` pastes in ``lua/includes/<fragment>.lua``. Scripts
run by EVALSHA and fall back to SCRIPT LOAD on NOSCRIPT (a restarted or failed-over Redis), in
single calls and in pipelines. Nothing here knows what a script does: ``wrappers`` does.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from ..connection import Client, is_cluster

LUA_DIR = Path(__file__).parent.parent / "lua"
_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.MULTILINE)


class LuaScript:
    """One script file. ``directory`` is for scripts outside the engine (the benchmarks' raw
    loop), which are loaded here too but are not among the production scripts (``ALL``)."""

    def __init__(self, name: str, directory: Path = LUA_DIR):
        self.name = name
        self.text = _INCLUDE.sub(_fragment, (directory / f"{name}.lua").read_text())
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()

    def __call__(self, client: Client, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.text)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def call(self, keys: Sequence[str], args: Sequence[Any]) -> Call:
        return Call(self, tuple(keys), tuple(args))


class Call(NamedTuple):
    """One script invocation waiting to be sent in a pipeline by ``run_calls``."""

    script: LuaScript
    keys: tuple
    args: tuple


def _fragment(match: re.Match) -> str:
    return (LUA_DIR / "includes" / f"{match.group(1)}.lua").read_text()


ENQUEUE = LuaScript("enqueue")
CANCEL = LuaScript("cancel")
CLAIM_DUE = LuaScript("claim_due")
CLAIM_PARCEL = LuaScript("claim_parcel")
PROMOTE = LuaScript("promote")
SETTLE_PARCEL = LuaScript("settle_parcel")
ACK = LuaScript("ack")
NACK = LuaScript("nack")
REAP = LuaScript("reap")
REQUEUE_DEAD = LuaScript("requeue_dead")
PURGE_DEAD = LuaScript("purge_dead")
PURGE_DEAD_BEFORE = LuaScript("purge_dead_before")
LEASE_ACQUIRE = LuaScript("lease_acquire")
LEASE_RENEW = LuaScript("lease_renew")
LEASE_RELEASE = LuaScript("lease_release")
SINGLETON_HOLD = LuaScript("singleton_hold")
WORKERS_PRUNE = LuaScript("workers_prune")
RATE_TAKE = LuaScript("rate_take")
QUOTA_TAKE = LuaScript("quota_take")
QUOTA_PENDING = LuaScript("quota_pending")
UNCLAIM = LuaScript("unclaim")
ALL = (
    ENQUEUE,
    CANCEL,
    CLAIM_DUE,
    CLAIM_PARCEL,
    SETTLE_PARCEL,
    PROMOTE,
    ACK,
    NACK,
    REAP,
    REQUEUE_DEAD,
    PURGE_DEAD,
    PURGE_DEAD_BEFORE,
    LEASE_ACQUIRE,
    LEASE_RENEW,
    LEASE_RELEASE,
    SINGLETON_HOLD,
    WORKERS_PRUNE,
    RATE_TAKE,
    QUOTA_TAKE,
    QUOTA_PENDING,
    UNCLAIM,
)


def load_all(client: Client) -> None:
    """SCRIPT LOAD every script (on a cluster: on every primary)."""
    for script in ALL:
        client.script_load(script.text)


def pipeline(client: Client):
    """A non-transactional pipeline; on a cluster, redis-py's cluster pipeline (routes per key)."""
    return client.pipeline() if is_cluster(client) else client.pipeline(transaction=False)


def run_calls(client: Client, calls: Sequence[Call]) -> list[Any]:
    """Send ``calls`` in one pipeline; calls refused with NOSCRIPT are re-sent after a load."""
    results = _send(client, calls)
    retry = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
    if retry:
        load_all(client)
        for i, result in zip(retry, _send(client, [calls[i] for i in retry]), strict=True):
            results[i] = result
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


def _send(client: Client, calls: Sequence[Call]) -> list[Any]:
    pipe = pipeline(client)
    for script, keys, args in calls:
        # execute_command: redis-py blocks the evalsha() helper on cluster pipelines, yet routes
        # EVALSHA by its first key like any other command.
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    return list(pipe.execute(raise_on_error=False))


def as_str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
