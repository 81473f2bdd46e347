"""Every Redis key the engine touches, and the slot function. No other module builds a key name.

Per (topic, slot) all keys share the hash tag ``{<topic>:<slot>}`` so that one Lua script may touch
them all on a Redis Cluster (they live on one node)::

    <prefix>:{<topic>:<slot>}:store    ZSET member = job id, score = due time (ms): what claims see
    <prefix>:{<topic>:<slot>}:later    ZSET the same, for jobs due after the next few minutes
                                       (moved into store ahead of time: promote.lua)
    <prefix>:{<topic>:<slot>}:prepare  ZSET score = deadline_ms * 1000 + attempt (claim_due.lua)
    <prefix>:{<topic>:<slot>}:dead     ZSET score = time it died (ms)
    <prefix>:{<topic>:<slot>}:meta     HASH "a:<id>" = attempts so far, "e:<id>" = last error
    <prefix>:{<topic>:<slot>}:parcels  HASH "<parcel id>" = ids of an in-flight parcel joined by
                                       ",", "#n" = ids in parcels, "#seq" (claim_parcel.lua)
    <prefix>:{<topic>:<slot>}:lease    STRING fencing token of the worker that owns the slot
    <prefix>:{<topic>:<slot>}:fence    STRING counter, INCR'd for every new lease token

Global keys have their own tags: the worker registry ``{<prefix>:workers}``, one key per singleton
lease, the round-robin counter and the per-topic set of slot layouts (slot counts still in use);
each quota owner's creations bucket and each topic's pending count is a key (and tag) of its own.

The prefix is the one installed in ``connection`` (read at call time, so tests can give each test
its own).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from . import connection

TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def prefix() -> str:
    return connection.prefix()


def slot_for(slot_basis: object, slots: int) -> int:
    """The CRC32 slot choice (``slots`` a power of two)."""
    return zlib.crc32(str(slot_basis).encode()) & (slots - 1)


@dataclass(frozen=True, slots=True)
class SlotKeys:
    topic: str
    slot: int
    store: str
    prepare: str
    dead: str
    meta: str
    lease: str
    fence: str
    parcels: str
    later: str


def slot_keys(topic: str, slot: int) -> SlotKeys:
    base = f"{prefix()}:{{{topic}:{slot}}}"
    return SlotKeys(
        topic=topic,
        slot=slot,
        store=f"{base}:store",
        prepare=f"{base}:prepare",
        dead=f"{base}:dead",
        meta=f"{base}:meta",
        lease=f"{base}:lease",
        fence=f"{base}:fence",
        parcels=f"{base}:parcels",
        later=f"{base}:later",
    )


def workers_info() -> str:
    """HASH worker id -> JSON (host, pid, version, started, owned slots, config version seen)."""
    return f"{prefix()}:{{workers}}:info"


def workers_alive() -> str:
    """ZSET worker id -> last sign of life of its process (ms), written apart from the dispatch
    loop, so a process whose loop is stuck is told from one that is gone."""
    return f"{prefix()}:{{workers}}:alive"


def workers_beats() -> str:
    """ZSET worker id -> last heartbeat (ms); same tag as ``workers_info`` so both move together."""
    return f"{prefix()}:{{workers}}:beats"


def singleton(name: str) -> str:
    return f"{prefix()}:singleton:{name}"


def round_robin(topic: str) -> str:
    """The shared ``INCR`` counter choosing which owned slot a worker polls first."""
    return f"{prefix()}:rr:{topic}"


def layouts(topic: str) -> str:
    """SET of slot counts that may still hold entries for ``topic`` (drained, then removed)."""
    return f"{prefix()}:layouts:{topic}"


def rate_bucket(topic: str) -> str:
    """HASH: the topic's token bucket (``rate_take.lua``), shared by every worker."""
    return f"{prefix()}:rate:{topic}"


def quota_bucket(owner: str) -> str:
    """HASH: one owner's creations bucket (``quota_take.lua``), its own key and hash tag, so any
    number of owners spread over a Redis Cluster."""
    return f"{prefix()}:quota:{{{owner}}}"


def quota_pending(topic: str) -> str:
    """STRING: the topic's pending jobs as its quota counts them (``quota_pending.lua``)."""
    return f"{prefix()}:quota-pending:{{{topic}}}"


def quota_near() -> str:
    """ZSET owner -> when (ms) its creations bucket last filled past the console's mark."""
    return f"{prefix()}:quota-near"


def epoch() -> str:
    """Set by the reminder workers once Redis holds the schedule; its absence means Redis lost
    its data (flush, restart without persistence) and the schedule must be rebuilt."""
    return f"{prefix()}:epoch"


def config_version() -> str:
    return f"{prefix()}:config:version"
