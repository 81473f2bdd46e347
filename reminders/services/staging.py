"""Pre-staged reminders: written into the inbox ahead of their due time, hidden until then.

A burst of 200,000 reminders due in one second cannot all be written in that second on two cores,
but the work is known in advance. With ``ReminderSettings.prestage_ms`` the dispatcher claims what
falls due within that window early (the engine's look-ahead) and delivery writes the inbox rows
at once, each with ``visible_at`` at its due moment: the inbox reads only rows whose ``visible_at``
has passed, so the user sees the reminder on the second, however long the writing took.

A staged reminder is a subscription ``sent`` with ``sent_at`` still ahead, and a notification
whose ``visible_at`` is still ahead. Until that moment a change of mind still wins:
``staged_withdraw`` (under the subscription row locks that delivery takes too) deletes the
hidden notification, and the caller then cancels, drops or moves the subscription as if it had
never been claimed. A notification merges a user's reminders of one merge window; its other
subscriptions go back to ``scheduled`` and are indexed again, so they are staged again at once in
a message of their own. A reminder already visible is delivered: nothing is withdrawn.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db.models import F, Q, QuerySet
from django.utils import timezone

from couponcenter.core.db.row_movement import retry_if_moved
from reminders.models import Notification, ReminderSubscription
from reminders.selectors import reminder_settings_get

from .indexing import BULK_CHUNK, index_on_commit

Status = ReminderSubscription.Status
REMINDER_KIND = "coupon_reminder"
# Rows due this much past the window may be in flight too (a claim a moment before the window
# moved, a settings change): locked as well. Delivery stages only rows due within the window
# (plus a few seconds), so every row it may be staging is locked here.
LOCK_SLACK_MS = 60_000


def staged_withdraw(
    *, subscriptions: QuerySet[ReminderSubscription], now: datetime | None = None
) -> list[int]:
    """Take the staged reminders of ``subscriptions`` back out of the inbox before they show.

    Must run inside the caller's transaction. Returns the ids among ``subscriptions`` that were
    withdrawn: they are ``scheduled`` again, not indexed in Redis (the caller decides what
    becomes of them). Their merge-mates in the same messages are ``scheduled`` and indexed again.
    """
    now = now or timezone.now()
    # Lock first, by id, every row a delivery may be staging right now: its committed version
    # still says "scheduled" (due within the window) until the delivery commits, and a locking
    # read that filtered on "sent" would skip it instead of waiting for it. Once the lock is
    # ours, the next statements see what that delivery committed.
    window = timedelta(milliseconds=reminder_settings_get().prestage_ms + LOCK_SLACK_MS)
    locked = (
        subscriptions.select_for_update()
        .filter(
            Q(status=Status.SCHEDULED, remind_at__lte=now + window)
            | Q(status=Status.SENT, sent_at__gt=now)
        )
        .order_by("pk")
        .values_list("pk", "user_id", "status", "sent_at")
    )
    # A row the lock waited for comes back as the delivery committed it.
    candidates = [
        (pk, user)
        for pk, user, status, sent_at in retry_if_moved(lambda: list(locked))
        if status == Status.SENT and sent_at > now
    ]
    if not candidates:
        return []
    wanted = {pk for pk, _ in candidates}
    users = sorted({user for _, user in candidates})
    notes, freed = [], set()
    for note_id, _, _, subs in hidden_reminder_notes(users, now):
        if subs & wanted:
            notes.append(note_id)
            freed |= subs
    if not notes:
        return []
    notifications_delete(notes)
    mates = sorted(freed - wanted)
    for start in range(0, len(mates), BULK_CHUNK):
        chunk = ReminderSubscription.objects.select_for_update().filter(
            pk__in=mates[start : start + BULK_CHUNK], status=Status.SENT
        )
        back: list[ReminderSubscription] = retry_if_moved(functools.partial(list, chunk))
        chunk.update(status=Status.SCHEDULED, sent_at=None, updated_at=now)
        for sub in back:
            sub.status = Status.SCHEDULED
        index_on_commit(back)
    withdrawn = sorted(freed & wanted)
    for start in range(0, len(withdrawn), BULK_CHUNK):
        ReminderSubscription.objects.filter(
            pk__in=withdrawn[start : start + BULK_CHUNK], status=Status.SENT
        ).update(status=Status.SCHEDULED, sent_at=None, updated_at=now)
    return withdrawn


def hidden_reminder_notes(
    user_ids: list[int], now: datetime
) -> Iterator[tuple[int, int, datetime, set[int]]]:
    """The reminder notifications of ``user_ids`` still hidden (staged), in chunks:
    ``(id, user id, visible_at, subscription ids)``."""
    for start in range(0, len(user_ids), BULK_CHUNK):
        rows = (
            Notification.objects.filter(
                user_id__in=user_ids[start : start + BULK_CHUNK],
                kind=REMINDER_KIND,
                visible_at__gt=now,
            )
            # What lets the lookup use the index of staged rows (``notification_staged``). A row
            # still hidden at the time of its commit was written before it shows, so this only
            # leaves out rows that were visible on commit (due between delivery's clock reading
            # and its insert's), which a ``now`` read before a lock wait may count as hidden:
            # already shown, they are delivered, as the module says.
            .filter(visible_at__gt=F("created_at"))
            .values_list("pk", "user_id", "visible_at", "payload")
        )
        for pk, user, visible_at, payload in rows:
            yield pk, user, visible_at, set((payload or {}).get("subscriptions") or ())


def notifications_delete(ids: list[int]) -> None:
    for start in range(0, len(ids), BULK_CHUNK):
        Notification.objects.filter(pk__in=ids[start : start + BULK_CHUNK]).delete()
