"""Delivery gateways (article 002): a batch in, one result per message out.

A gateway never retries by itself: it reports which messages failed, and only those are retried
(by the engine's nack, with backoff) or, past the attempt limit, sent to the dead queue with an
alert. Every message carries a ``dedup_key``; the inbox ledger is unique on (user_id, dedup_key),
and webhooks get it as the ``Idempotency-Key`` header, so a redelivered message is seen once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings
from django.db import connection
from django.utils import timezone

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
        # more time preparing values than PostgreSQL spends writing them.
        table = Notification._meta.db_table
        now = timezone.now()
        rows = [(m.user_id, m.dedup_key, m.kind, m.title, m.body, json.dumps(m.payload), now)
                for m in messages]  # fmt: skip
        with connection.cursor() as cursor:
            for start in range(0, len(rows), INSERT_CHUNK):
                chunk = rows[start : start + INSERT_CHUNK]
                values = ",".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
                cursor.execute(
                    f"INSERT INTO {table} (user_id, dedup_key, kind, title, body, payload, "
                    f"created_at) VALUES {values} ON CONFLICT (user_id, dedup_key) DO NOTHING",
                    [value for row in chunk for value in row],
                )
        return [Delivered(True)] * len(messages)


class LogGateway:
    name = "log"

    def deliver(self, messages: list[Message]) -> list[Delivered]:
        for m in messages:
            logger.info("notification", extra={"user_id": m.user_id, "dedup_key": m.dedup_key,
                                               "title": m.title})  # fmt: skip
        return [Delivered(True)] * len(messages)


def sign(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookGateway:
    """A signed HTTP POST per message (HMAC-SHA256 of the body), with an idempotency key."""

    name = "webhook"

    def __init__(self, url: str | None = None, secret: str | None = None) -> None:
        self.url = url or settings.NOTIFY_WEBHOOK_URL
        self.secret = secret or settings.NOTIFY_WEBHOOK_SECRET
        if not self.url:
            raise ValueError("NOTIFY_WEBHOOK_URL is not set")
        if self.url.startswith("http://") and not settings.WEBHOOK_ALLOW_HTTP:
            raise ValueError(f"plain-HTTP webhook refused: {self.url} (set WEBHOOK_ALLOW_HTTP=1)")

    def deliver(self, messages: list[Message]) -> list[Delivered]:
        import requests

        results = []
        with requests.Session() as session:
            for m in messages:
                body = json.dumps(
                    {"user_id": m.user_id, "kind": m.kind, "title": m.title, "body": m.body,
                     "payload": m.payload}, sort_keys=True,
                ).encode()  # fmt: skip
                try:
                    response = session.post(
                        self.url,
                        data=body,
                        timeout=settings.WEBHOOK_TIMEOUT_S,
                        headers={
                            "Content-Type": "application/json",
                            "Idempotency-Key": m.dedup_key,
                            "X-Coupon-Center-Signature": f"sha256={sign(self.secret, body)}",
                        },
                    )
                    response.raise_for_status()
                except requests.RequestException as exc:
                    results.append(Delivered(False, f"{exc.__class__.__name__}: {exc}"[:300]))
                else:
                    results.append(Delivered(True))
        return results


def gateway_for(name: str) -> Gateway:
    if name == "inbox":
        return InboxGateway()
    if name == "log":
        return LogGateway()
    if name == "webhook":
        return WebhookGateway()
    raise ValueError(f"unknown gateway {name!r}")


def raise_alert(*, title: str, details: dict[str, Any]) -> None:
    """A structured error log line, and a chat-friendly POST to ``ALERT_WEBHOOK_URL`` if set."""
    logger.error("ALERT %s", title, extra={"alert": title, **details})
    url = settings.ALERT_WEBHOOK_URL
    if not url:
        return
    import requests

    text = f":rotating_light: {title}\n" + "\n".join(f"- {k}: {v}" for k, v in details.items())
    try:
        response = requests.post(url, json={"text": text, "title": title, "details": details},
                                 timeout=settings.WEBHOOK_TIMEOUT_S)  # fmt: skip
        response.raise_for_status()  # a refused alert must show in the log, not vanish
    except requests.RequestException:
        logger.exception("alert webhook failed", extra={"url": url})
