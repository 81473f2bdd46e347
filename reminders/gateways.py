"""Delivery gateways (docs/reminders.md, Deliver): a batch in, one result per message out.

A gateway never retries by itself: it reports which messages failed, and only those are retried
(by the engine's nack, with backoff) or, past the attempt limit, sent to the dead queue with an
alert. Every message carries a ``dedup_key``; the inbox ledger is unique on (user_id, dedup_key),
and webhooks get it as the ``Idempotency-Key`` header, so a redelivered message is seen once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import requests
from django.conf import settings
from django.db import connection
from django.utils import timezone

from couponcenter.core.webhooks import check_target, guarded_session, post_signed, secret_problem
from reminders.models import Notification

logger = logging.getLogger(__name__)
INSERT_CHUNK = 500  # rows per INSERT statement (SQLite allows 32,766 parameters)


@dataclass
class Message:
    user_id: int
    dedup_key: str
    title: str
    body: str
    payload: dict[str, Any] = field(default_factory=dict)
    kind: str = "coupon_reminder"
    # Pre-staged: not to be shown before this moment (the inbox hides it until then; gateways
    # that push at once never get a staged message, see ``ReminderSettings.topic_settings``).
    visible_at: datetime | None = None
    # The push cap's decision (``services.push_cap``): pushed, or inbox only (and held for a
    # digest).
    push: bool = True
    held: bool = False


@dataclass(frozen=True)
class Delivered:
    ok: bool
    error: str = ""


class Gateway(Protocol):
    name: str

    def deliver(self, messages: list[Message]) -> list[Delivered]: ...


class InboxGateway:
    """A ``Notification`` row per message, read through the API; duplicates are ignored."""

    name = "inbox"

    def deliver(self, messages: list[Message]) -> list[Delivered]:
        # One multi-row INSERT ... ON CONFLICT DO NOTHING per chunk: the ORM's bulk_create spends
        # more time preparing values than PostgreSQL spends writing them. No conflict target:
        # every unique key of the row's table is the ledger's. On SQLite that is
        # (user_id, dedup_key); on PostgreSQL, partitioned by visible_at, it is
        # (user_id, dedup_key, visible_at), the same guarantee since a message's visible_at is
        # its due moment, the same on every delivery (services.notification_partitions), plus
        # (user_id, dedup_key) in the first partition, the table from before the partitioning.
        table = Notification._meta.db_table
        # Times as the ORM writes them (SQLite keeps naive UTC text and compares it as text).
        db_time = connection.ops.adapt_datetimefield_value
        now = db_time(timezone.now())
        rows = [
            (
                m.user_id,
                m.dedup_key,
                m.kind,
                m.title,
                m.body,
                json.dumps(m.payload),
                now,
                db_time(m.visible_at) if m.visible_at else now,
                m.push,
                m.held,
            )
            for m in messages
        ]
        with connection.cursor() as cursor:
            for start in range(0, len(rows), INSERT_CHUNK):
                chunk = rows[start : start + INSERT_CHUNK]
                values = ",".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
                cursor.execute(
                    f"INSERT INTO {table} (user_id, dedup_key, kind, title, body, payload, "
                    f"created_at, visible_at, push, held) VALUES {values} "
                    "ON CONFLICT DO NOTHING",
                    [value for row in chunk for value in row],
                )
        return [Delivered(True)] * len(messages)


class LogGateway:
    name = "log"

    def deliver(self, messages: list[Message]) -> list[Delivered]:
        for m in messages:
            logger.info(
                "notification",
                extra={"user_id": m.user_id, "dedup_key": m.dedup_key, "title": m.title},
            )
        return [Delivered(True)] * len(messages)


class WebhookGateway:
    """A POST per message, signed per Standard Webhooks (``couponcenter.core.webhooks``) with
    the message's dedup key as its ``webhook-id``; refuses a guessable secret."""

    name = "webhook"

    def __init__(
        self,
        url: str | None = None,
        secret: str | None = None,
        *,
        previous_secret: str | None = None,
        legacy_signature: bool | None = None,
    ) -> None:
        self.url = url or settings.NOTIFY_WEBHOOK_URL
        if not self.url:
            raise ValueError("NOTIFY_WEBHOOK_URL is not set")
        check_target(self.url, what="webhook")
        self.secrets = gateway_secrets(
            secret or settings.NOTIFY_WEBHOOK_SECRET,
            settings.NOTIFY_WEBHOOK_PREVIOUS_SECRET if previous_secret is None else previous_secret,
        )
        self.legacy_signature = (
            settings.NOTIFY_WEBHOOK_LEGACY_SIGNATURE
            if legacy_signature is None
            else legacy_signature
        )

    def deliver(self, messages: list[Message]) -> list[Delivered]:
        results = []
        with guarded_session() as session:
            for m in messages:
                body = json.dumps(
                    {
                        "user_id": m.user_id,
                        "kind": m.kind,
                        "title": m.title,
                        "body": m.body,
                        "payload": m.payload,
                    },
                    sort_keys=True,
                ).encode()
                try:
                    post_signed(
                        self.url,
                        body,
                        secrets=self.secrets,
                        idempotency_key=m.dedup_key,
                        session=session,
                        what="webhook",
                        legacy_signature=self.legacy_signature,
                    )
                except requests.RequestException as exc:
                    results.append(Delivered(False, f"{exc.__class__.__name__}: {exc}"[:300]))
                else:
                    results.append(Delivered(True))
        return results


def gateway_secrets(secret: str, previous: str) -> tuple[str, ...]:
    """The gateway's signing secrets, the current one first (``ValueError``: a guessable one)."""
    named = [("NOTIFY_WEBHOOK_SECRET", secret)]
    if previous:
        named.append(("NOTIFY_WEBHOOK_PREVIOUS_SECRET", previous))
    for what, value in named:
        problem = secret_problem(value, what=what)
        if problem:
            raise ValueError(problem)
    return tuple(value for _, value in named)


def gateway_for(name: str) -> Gateway:
    if name == "inbox":
        return InboxGateway()
    if name == "log":
        return LogGateway()
    if name == "webhook":
        return WebhookGateway()
    raise ValueError(f"unknown gateway {name!r}")
