"""Coupon reminders on the engine: the ``coupon.reminder`` topic's handler (docs/reminders.md).

A claimed batch of one slot is handed on to delivery as it is, in Celery batches
(``deliver_reminders``), never one task per reminder: the entries one claim round hands on, over
all slots, travel together (up to the batch size per task), so a steady trickle over 16 slots is
one task per round, not sixteen. The dispatcher does nothing per entry that delivery must do
again: delivery reads each subscription's row, and with it drops what can no longer help
(cancelled, sold out, closed, too late), merges a user's reminders of one merge window into one
message, and writes or sends it.

The handed-on parcels stay in the slot's prepare set: the delivery task settles each parcel whole
(the failed ids retried with backoff or dead, the rest done), so a Celery worker dying mid-delivery
only delays them until the visibility deadline, when the reaper puts them back (at-least-once; the
inbox ledger makes it once for the user).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from functools import partial

from django.conf import settings

from couponcenter.core.redis import broker_client
from reminders import metrics
from reminders.engine.clock import epoch_ms
from reminders.engine.knobs import knob_values
from reminders.engine.scripts import Parcel
from reminders.engine.topic_model import HANDED_ON, Result, Topic
from reminders.members import REMINDER_TOPIC, REMINDER_TOPIC_HIGH
from reminders.selectors import reminder_settings_get
from reminders.services.settling import reminders_dead, reminders_retry_parcels
from reminders.tasks import deliver_reminders

logger = logging.getLogger(__name__)


def reminder_topics() -> list[Topic]:
    """The high-priority reminder topic (drained first) and the normal one."""
    live = reminder_settings_get().topic_settings()
    return [
        Topic(
            name=name,
            handler=partial(handle_reminders, name),
            flush=partial(end_round, name),
            pass_slot=True,
            on_dead=partial(reminders_dead, name),
            priority=priority,
            batch_size=live.batch_size,
            **knob_values(live),
            needs_due=False,  # due times come from the database rows at delivery
            isolate_suspects=False,  # entries are handed on; delivery runs in Celery
            parcels=True,  # a claimed batch travels as one in-flight entry and one string
        )
        for name, priority in ((REMINDER_TOPIC_HIGH, 1), (REMINDER_TOPIC, 0))
    ]


def handle_reminders(topic: str, parcel: Parcel, slot: int) -> Result:
    """The engine handler: hand the parcel (one claimed batch) on to delivery.

    The hot path of a burst (200,000 entries in a second), so it does nothing per entry: a
    parcel's ids travel as the one string Redis returned. A slot holds all of one user's
    entries and one claim takes what is due now, so the delivery task sees all of a user's
    reminders claimed together and merges them.
    """
    parcels = _outbox[topic]
    parcels.append(parcel)
    _round_counts[topic]["dispatched"] += parcel.size
    if sum(p.size for p in parcels) >= reminder_settings_get().batch_size:
        flush_reminders(topic)
    return HANDED_ON


# Per topic, the parcels this round handed on and has not published yet.
_outbox: dict[str, list[Parcel]] = defaultdict(list)
# Per topic, this round's dispatched count, recorded once at its end (a burst's round claims a
# hundred batches, and a metrics round trip for each would add a fifth to its time).
_round_counts: dict[str, Counter[str]] = defaultdict(Counter)


def end_round(topic: str) -> None:
    """The topic's flush hook, at the end of each claim round: publish what the outbox holds,
    then record the round's counts (also when the publish failed: those entries were claimed
    and went back to their slots, as the log says)."""
    try:
        flush_reminders(topic)
    finally:
        counts = _round_counts.pop(topic, None)
        if counts:
            metrics.record(topic, counts)


def flush_reminders(topic: str) -> None:
    """Publish the topic's outbox as one Celery task. A user's entries all live in one slot and
    one claim takes every due one, so the task still sees them together and merges them.

    If the broker refuses the task, the entries go back to their slots with backoff (and count an
    attempt), as a failed delivery's do; if Redis refuses that too they stay in prepare and the
    reaper returns them after the visibility timeout.
    """
    parcels = _outbox.pop(topic, None)
    if not parcels:
        return
    batch: dict = {"topic": topic, "parcels": [[p.slot, p.parcel_id, p.members] for p in parcels]}
    attempts = {job_id: n for p in parcels for job_id, n in p.attempts.items()}
    if attempts:
        batch["attempts"] = attempts
    count = sum(p.size for p in parcels)
    try:
        # argsrepr: Celery would otherwise saferepr() the whole batch into the message headers.
        # retry=False: a broker that is down fails this at once (the entries go back with
        # backoff) instead of holding the claim round in kombu's reconnect loop.
        deliver_reminders.apply_async(args=[batch], argsrepr=f"({count} reminders)", retry=False)
    except Exception as exc:
        logger.exception("handing %d reminders of %s to Celery failed", count, topic)
        error = f"{type(exc).__name__}: {exc}"[:500]
        failures = [
            (p.slot, p.parcel_id, [(job_id, error) for job_id in p.job_ids()]) for p in parcels
        ]
        reminders_retry_parcels(topic, failures, live=reminder_settings_get(), now_ms=epoch_ms())
        raise


def delivery_queue_depth() -> int:
    """Reminder batches waiting in the Celery queue (for backpressure); 0 for non-Redis brokers."""
    client = broker_client()
    return 0 if client is None else int(client.llen(settings.DELIVERY_QUEUE))
