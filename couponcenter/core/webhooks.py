"""The one signed-POST helper for every outbound call (the reminders' webhook gateway, ``http``
timeout topics).

A body is JSON bytes signed with HMAC-SHA256 (``X-Coupon-Center-Signature: sha256=<hex>``) and
sent with an ``Idempotency-Key``, so a receiver can check who sent it and absorb a redelivery.
Plain-HTTP targets are refused unless ``WEBHOOK_ALLOW_HTTP`` is on (development and tests),
whatever the case of the scheme. A redirect is a failure and is never followed (following it
would re-send the body, the signature and the idempotency key to wherever it points). A failure
names the target by its scheme and host only: a webhook's path and query often are its secret, and
the message ends up in logs, ``last_error`` columns and the API.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

import requests
from django.conf import settings

SIGNATURE_HEADER = "X-Coupon-Center-Signature"


def sign(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class OutboundCallFailed(requests.RequestException):
    """An outbound call failed; the message names the target's scheme and host only."""


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: what may be logged or stored about a target."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.hostname or ''}" + (
        f":{parts.port}" if parts.port else ""
    )


def check_target(url: str, *, what: str = "target") -> None:
    """Raises ``ValueError`` for a target this service may not call."""
    if urlsplit(url).scheme.lower() == "http" and not settings.WEBHOOK_ALLOW_HTTP:
        raise ValueError(f"plain-HTTP {what} refused: {origin(url)} (set WEBHOOK_ALLOW_HTTP=1)")


def post_signed(
    url: str,
    body: bytes,
    *,
    secret: str,
    idempotency_key: str,
    session: requests.Session | None = None,
    what: str = "target",
) -> requests.Response:
    """POST ``body`` signed; raises ``ValueError`` (refused target) or ``OutboundCallFailed`` (the
    call failed, or the receiver answered a redirect or an error status)."""
    check_target(url, what=what)
    try:
        response = (session or requests).post(
            url,
            data=body,
            timeout=settings.WEBHOOK_TIMEOUT_S,
            allow_redirects=False,
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": idempotency_key,
                SIGNATURE_HEADER: f"sha256={sign(secret, body)}",
            },
        )
    except requests.RequestException as exc:
        raise OutboundCallFailed(f"{exc.__class__.__name__} calling {origin(url)}") from None
    if response.status_code >= 300:
        kind = "redirect (not followed)" if response.status_code < 400 else "error"
        raise OutboundCallFailed(f"HTTP {response.status_code} {kind} from {origin(url)}")
    return response
