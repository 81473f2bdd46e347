"""The queue API: schedule, cancel, claim, ack, nack, reap, inspect and steer dead jobs.

Every function takes the topic and the slot explicitly: the slot count of a topic can change at
runtime, so the caller stores each job's slot (``slot_for(basis, slots)`` at schedule time) and
uses it to cancel. Slot layouts (slot counts) still holding entries are kept in a per-topic set
(``layouts``). Every function accepts ``client=`` (default: the connection installed in
``connection``), standalone or cluster.

Callers use the names exported here; the modules behind them are cut by who calls them:
``scheduling`` (producers), ``consuming`` (the slot's owner), ``settling`` (whoever entries were
handed on to), ``backlog`` (reads), ``dead`` (dead jobs), ``layouts`` (slot counts in use).
"""

from .backlog import (
    Place,
    SlotStats,
    due_before,
    due_between,
    due_count,
    earliest_due,
    heads,
    in_parcels,
    place,
    stats,
)
from .consuming import PROMOTE_LIMIT, ack, bury, claim, claim_parcel, nack, promote, reap, unclaim
from .dead import DeadEntry, list_dead, purge_dead, purge_dead_before, requeue_dead
from .layouts import (
    prune_layouts,
    record_layout,
    record_layout_covering,
    served_slot_count,
    slot_layouts,
)
from .scheduling import (
    LATER_AFTER_MS,
    cancel,
    cancel_anywhere,
    cancel_many,
    schedule,
    schedule_many,
)
from .settling import HANDED_TOKEN, ack_handed, ack_handed_many, nack_handed, settle_parcels

__all__ = [
    "HANDED_TOKEN",
    "LATER_AFTER_MS",
    "PROMOTE_LIMIT",
    "DeadEntry",
    "Place",
    "SlotStats",
    "ack",
    "ack_handed",
    "ack_handed_many",
    "bury",
    "cancel",
    "cancel_anywhere",
    "cancel_many",
    "claim",
    "claim_parcel",
    "due_before",
    "due_between",
    "due_count",
    "earliest_due",
    "heads",
    "in_parcels",
    "list_dead",
    "nack",
    "nack_handed",
    "place",
    "promote",
    "prune_layouts",
    "purge_dead",
    "purge_dead_before",
    "reap",
    "record_layout",
    "record_layout_covering",
    "requeue_dead",
    "schedule",
    "schedule_many",
    "served_slot_count",
    "settle_parcels",
    "slot_layouts",
    "stats",
    "unclaim",
]
