"""The Redis sorted-set timeout engine (docs/engine.md): plain Python on redis-py.

Invariants (every module in this package keeps them):

1. Redis holds the schedule, not the truth. A job is its id string (member); the database row it
   stands for is authoritative, so what is lost here is rebuilt by ``schedule_many(nx=True)``.
2. Per (topic, slot) a job is in one of three sorted sets sharing one hash tag:
   ``store`` (score = due ms), ``prepare`` (in flight; score = deadline_ms * 1000 + attempt, which
   stays below 2^53 until the year 2255 with attempt <= 999) and ``dead`` (score = when it died).
   Attempts and last error survive moves in the slot's ``meta`` hash. The one exception: moving a
   job that is in flight adds a store copy next to it (the handler re-reads the truth anyway).
   A job due more than ``LATER_AFTER_MS`` ahead when scheduled waits in a fourth set, ``later``,
   which counts as scheduled everywhere (cancel, NX, stats, place); the slot's owner moves what
   falls due within that much (plus the topic's look-ahead) into ``store`` every maintenance
   tick (``promote``, and every tick while a slot has more than one call moves), so claims work
   on a set of the next minutes, however long the backlog.
3. Every move between the sets is one Lua script, bounded by a LIMIT, given ``now`` in ms: no
   read-then-remove across round trips, no TIME inside a script, no key built inside a script.
4. Delivery is at least once. A claimed job leaves prepare only by ack (done), nack (retry with
   backoff, or dead at max_attempts), a parcel's settle (the same for each id: see 8) or reap
   (its visibility deadline passed).
5. Only the holder of a slot's lease claims, acks or nacks in it: the lease's fencing token is
   checked inside those scripts, and every new lease takes a fresh token from the slot's INCR'd
   fence, so a worker that lost its lease can never move an entry again.
6. A handler may hand entries on (``HANDED_ON``): they stay in prepare, and whoever they were handed
   to (a Celery delivery task) settles them with ``ack_handed`` / ``nack_handed``, or a parcel with
   ``settle_parcels``, which are not fenced. A settle that meets an entry reaped and re-claimed
   meanwhile does no harm: handling is idempotent against the database ledger, and an entry nobody
   settles is reaped after the visibility deadline.
7. A job's slot is ``crc32(slot_basis) & (slots - 1)``; the caller stores it. Slot counts are powers
   of two, and workers serve every layout still holding entries until it is drained.
8. A topic that hands whole batches on may claim them as parcels (``Topic.parcels``): one prepare
   entry ``#<parcel id>`` per batch (its score's attempt is always 1), its ids one string in the
   slot's ``parcels`` hash, attempts past the first in ``meta``; parcel ids start from the claim
   time when a slot's parcels hash is new, so none is reused after Redis lost its data. A parcel
   leaves whole: ``settle_parcels`` (its failed ids retried or dead, the rest done) or the reaper
   (each id as an entry would be). Nothing looks inside a parcel: ``cancel``, ``place`` and
   ``schedule_many(nx=True)`` do not see its ids, so the owner acts on its own record, not on where
   Redis has the id.
"""

from .keys import slot_for
from .queue import (
    DeadEntry,
    SlotStats,
    ack,
    ack_handed,
    ack_handed_many,
    bury,
    cancel,
    cancel_anywhere,
    cancel_many,
    claim,
    claim_parcel,
    list_dead,
    nack,
    nack_handed,
    purge_dead,
    reap,
    record_layout,
    requeue_dead,
    schedule,
    schedule_many,
    served_slot_count,
    settle_parcels,
    slot_layouts,
    stats,
)
from .scripts import Claimed, EngineError, LeaseLost, Parcel
from .topic_model import (
    DROP,
    HANDED_ON,
    OK,
    Dead,
    EngineSettings,
    Result,
    Retry,
    Topic,
    TopicSettings,
    all_topics,
    get_topic,
    register_topic,
)

__all__ = [
    "Claimed",
    "DROP",
    "Dead",
    "DeadEntry",
    "EngineError",
    "EngineSettings",
    "HANDED_ON",
    "LeaseLost",
    "OK",
    "Parcel",
    "Result",
    "Retry",
    "SlotStats",
    "Topic",
    "TopicSettings",
    "ack",
    "ack_handed",
    "ack_handed_many",
    "all_topics",
    "bury",
    "cancel",
    "cancel_anywhere",
    "cancel_many",
    "claim",
    "claim_parcel",
    "get_topic",
    "list_dead",
    "nack",
    "nack_handed",
    "purge_dead",
    "reap",
    "record_layout",
    "register_topic",
    "requeue_dead",
    "schedule",
    "schedule_many",
    "served_slot_count",
    "settle_parcels",
    "slot_for",
    "slot_layouts",
    "stats",
]
