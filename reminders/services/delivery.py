"""Delivering reminder batches: the entry point of the Celery delivery task.

A batch is what the dispatcher handed on from one claim round, one engine parcel per claimed
batch: ``{"topic", "parcels": [[slot, parcel id, "member,member,..."], ...], "attempts":
{member: n}}`` (members as ``reminders.members`` spells them; a member missing from ``attempts``
is on its first attempt). Each parcel is settled whole once the batch is done. The per-entry
forms ``{"topic", "parts": [[slot, [member, ...]], ...]}`` and ``{"topic", "slot", "members"}``,
whose entries are in flight one by one, are accepted too: tasks queued by an older worker still
run after an upgrade.

The batch goes to the inbox (``services.inbox``, one transaction) or through an external gateway
(``services.external``, deliver then mark), as messages built by ``services.messages``; then it
is settled in the engine (``services.settling``).

Invariants:
- a subscription is delivered only while it is ``scheduled``, and only while its coupon can still
  help (not cancelled, sold out or closed: such reminders are ``dropped`` with the reason, and
  counted). The dispatcher hands entries on without looking at them, so this is the one check,
  made as late as it can be. For the inbox, marking it ``sent`` and writing the notification
  commit together, so a user never sees the same reminder twice;
- for external gateways (webhook) the message's ``dedup_key`` is the ``Idempotency-Key``, so a
  crash between the POST and marking ``sent`` is absorbed by the receiver;
- a user's reminders whose ``remind_at`` falls in the same merge window become one message;
- only failed messages are retried (``settle_parcels``, with backoff); past ``max_attempts`` they
  are dead in the engine, ``failed`` in the database, and an alert is raised;
- entries leave the prepare set only after the database says what happened to them;
- nothing is sent before its row's ``remind_at``: an entry that fired early (a stale copy, or one
  indexed before its coupon moved) is put back at that time. The inbox stages hidden only what
  falls due within the look-ahead window, and puts back what is due later.
"""

from __future__ import annotations

import logging
from typing import Any

from reminders.gateways import InboxGateway, gateway_for
from reminders.members import sub_id_of, try_sub_id_of
from reminders.models import ReminderSettings
from reminders.selectors import reminder_settings_get

from .external import reminders_deliver_external
from .inbox import reminders_deliver_inbox
from .settling import Report, reminders_settle

logger = logging.getLogger(__name__)


def reminders_deliver(batch: dict[str, Any]) -> dict[str, int]:
    topic = batch["topic"]
    parcels = [
        (slot, parcel_id, packed.split(",")) for slot, parcel_id, packed in batch.get("parcels", ())
    ]
    if parcels:
        slot_of = {member: slot for slot, _, members in parcels for member in members}
    else:  # a per-entry form, each entry in flight on its own
        parts = batch["parts"] if "parts" in batch else [[batch["slot"], batch["members"]]]
        slot_of = {member: slot for slot, members in parts for member in members}
    members = list(slot_of)
    # An entry that names no subscription (written by hand, or spelled otherwise) fails alone,
    # retried and then dead where the console shows it, instead of failing its whole batch at
    # every attempt.
    strays = {m for m in members if try_sub_id_of(m) is None}
    if strays:
        logger.error(
            "%d entries of %s name no subscription, e.g. %r", len(strays), topic, min(strays)
        )
        members = [m for m in members if m not in strays]
    attempts = batch.get("attempts") or {}
    redelivered = sum(1 for m in members if attempts.get(m, 1) >= 2)
    # Checked now, not from the process's cache: one small query a batch, and a change of the
    # policy (the push cap, the late limit) applies from the next batch on.
    live = reminder_settings_get(max_age_s=0)
    try:
        gateway = gateway_for(live.gateway)
        if isinstance(gateway, InboxGateway):
            report = reminders_deliver_inbox(gateway, members, live)
        else:
            report = reminders_deliver_external(gateway, members, attempts, live)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the batch is settled as failed
        report = _crashed(members, attempts, live, exc)
    report.failed += [(m, "not a reminder member") for m in sorted(strays)]
    return {**reminders_settle(topic, slot_of, parcels, live, report), "redelivered": redelivered}


def _crashed(
    members: list[str], attempts: dict[str, int], live: ReminderSettings, exc: Exception
) -> Report:
    """The whole batch failed before any message was out (the inbox transaction rolled back):
    every entry is failed with the real error, retried or dead by its attempts, never left in
    flight for the reaper (which could only say "visibility timeout")."""
    logger.exception("delivering %d reminders failed", len(members))
    error = f"{exc.__class__.__name__}: {exc}"[:300]
    report = Report(failed=[(member, error) for member in members])
    report.dead = [sub_id_of(m) for m in members if attempts.get(m, 1) >= live.max_attempts]
    return report
