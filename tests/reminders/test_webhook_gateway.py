"""The notification webhook gateway: signed bodies (Standard Webhooks), idempotency keys, no plain
HTTP.

A real HTTP receiver on 127.0.0.1 checks what arrives.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reminders.gateways import WebhookGateway
from tests.support.standard_webhooks import Check, verify_python

SECRET = "webhook-secret-of-at-least-32-bytes"


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.fail_next = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                status = 500 if receiver.fail_next > 0 else 204
                receiver.fail_next -= 1
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def messages(n: int):
    from reminders.gateways import Message

    fields = Message.__dataclass_fields__
    out = []
    for i in range(n):
        values = {"user_id": 100 + i, "kind": "reminder", "title": f"t{i}", "body": "b",
                  "payload": {"coupon": i}, "dedup_key": f"reminder:{i}"}  # fmt: skip
        out.append(Message(**{k: v for k, v in values.items() if k in fields}))
    return out


def test_each_body_is_signed_and_carries_its_idempotency_key(receiver, settings):
    # Forgeries and replays: tests/reminders/test_standard_webhooks.py, with both libraries.
    settings.WEBHOOK_ALLOW_HTTP = True
    results = WebhookGateway(url=receiver.url, secret=SECRET).deliver(messages(2))
    assert [r.ok for r in results] == [True, True]
    for (headers, body), key in zip(receiver.requests, ["reminder:0", "reminder:1"], strict=True):
        assert verify_python(Check(SECRET, headers, body)) is None
        assert headers["webhook-id"] == headers["Idempotency-Key"] == key
        assert json.loads(body)["user_id"] in (100, 101)


def test_only_the_failed_items_are_reported_failed(receiver, settings):
    settings.WEBHOOK_ALLOW_HTTP = True
    receiver.fail_next = 1
    results = WebhookGateway(url=receiver.url, secret=SECRET).deliver(messages(3))
    assert [r.ok for r in results] == [False, True, True]


def test_plain_http_is_refused_unless_allowed(settings):
    settings.WEBHOOK_ALLOW_HTTP = False
    with pytest.raises(ValueError, match="plain-HTTP webhook refused"):
        WebhookGateway(url="http://example.com/hook", secret=SECRET)
    WebhookGateway(url="https://example.com/hook", secret=SECRET)  # https is fine


def test_the_gateway_needs_a_url(settings):
    settings.NOTIFY_WEBHOOK_URL = ""
    with pytest.raises(ValueError, match="NOTIFY_WEBHOOK_URL"):
        WebhookGateway()


@pytest.mark.parametrize("secret", ["", "too-short"])
def test_the_gateway_refuses_a_short_secret(settings, secret):
    settings.NOTIFY_WEBHOOK_SECRET = secret
    with pytest.raises(ValueError, match="at least 32 bytes"):
        WebhookGateway(url="https://hooks.example.com/hook")
