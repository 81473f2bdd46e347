"""Rows in the engine's index: a subscription's entry follows its row once a transaction commits,
and a rebuild re-indexes rows of either kind (``rebuild_rows``).

The member of a subscription's entry is its id in base 36 (``members.member``) in its stored slot,
on the topic of its priority. An entry indexed under the long member form (``members``) is not
looked for: its row decides what it does when it fires (delivery acts only on scheduled rows, and
never shows or sends one before its row's ``remind_at``), and the reconcile prunes it once its row
is final.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django.db.models import QuerySet

from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPICS, member, reminder_topic_for
from reminders.models import ReminderSubscription

BULK_CHUNK = 5000  # rows per bulk read, statement or index call


def by_topic(rows, key: Callable) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for row in rows:
        topic, item = key(row)
        grouped.setdefault(topic, []).append(item)
    return grouped


def layouts_record_on_commit(slots: int) -> None:
    """Note, once the transaction commits, that the reminder topics use ``slots`` slots."""

    def record() -> None:
        for topic in REMINDER_TOPICS:
            queue.record_layout(topic, slots)

    transaction.on_commit(record)


def index_on_commit(subs: list[ReminderSubscription]) -> None:
    """Schedule (or move) these subscriptions' entries once the transaction commits."""
    grouped = by_topic(
        subs,
        lambda s: (
            reminder_topic_for(s.priority),
            (member(s.pk), epoch_ms(s.remind_at), s.slot),
        ),
    )

    def index() -> None:
        for topic, items in grouped.items():
            queue.schedule_many(topic, items)

    if grouped:
        transaction.on_commit(index)


def unindex_on_commit(subs: list[tuple[int, int, str]]) -> None:
    """(sub id, slot, priority) entries leave Redis once committed."""
    grouped = by_topic(subs, lambda r: (reminder_topic_for(r[2]), (member(r[0]), r[1])))

    def unindex() -> None:
        for topic, items in grouped.items():
            queue.cancel_many(topic, items)

    if grouped:
        transaction.on_commit(unindex)


def rebuild_rows(
    rows: QuerySet,
    fields: tuple[str, ...],
    entry: Callable[[tuple], tuple[str, tuple[str, int, int]]],
    *,
    in_flight: Callable[[str, set[int]], dict[int, set[str]]] | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Index ``rows`` with the engine's NX mode (an entry in store, prepare or dead is left
    alone); returns how many were added. ``BULK_CHUNK`` rows a query, in primary-key order,
    each query starting after the last key of the one before (no OFFSET). ``entry`` maps a row
    (its ``pk``, then ``fields``) to its topic and ``(member, due_ms, slot)``; ``in_flight``
    gives, per slot, the members in flight where NX cannot see (a parcel's), which are left
    out; it is read for each chunk, after its rows."""
    added, last_pk = 0, 0
    while True:
        chunk = list(
            rows.filter(pk__gt=last_pk).order_by("pk").values_list("pk", *fields)[:BULK_CHUNK]
        )
        if not chunk:
            return added
        for topic, items in by_topic(chunk, entry).items():
            slots = {slot for _, _, slot in items}
            queue.record_layout_covering(topic, slots)
            if in_flight is not None:
                skip = in_flight(topic, slots)  # slot -> members
                items = [item for item in items if item[0] not in skip.get(item[2], ())]
            added += queue.schedule_many(topic, items, nx=True)
        last_pk = chunk[-1][0]
        if progress is not None:
            progress(len(chunk))
