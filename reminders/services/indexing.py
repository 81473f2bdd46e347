"""Subscriptions in the engine's index: their entries follow the rows once a transaction commits.

The member of a subscription's entry is its id in base 36 (``members.member``) in its stored slot,
on the topic of its priority. An entry indexed under the long member form (``members``) is not
looked for: its row decides what it does when it fires (delivery acts only on scheduled rows, and
never shows or sends one before its row's ``remind_at``), and the reconcile prunes it once its row
is final.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import member, reminder_topic_for
from reminders.models import ReminderSubscription

BULK_CHUNK = 5000  # rows per bulk read, statement or index call


def by_topic(rows, key: Callable) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for row in rows:
        topic, item = key(row)
        grouped.setdefault(topic, []).append(item)
    return grouped


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
